"""A TCP proxy for fault injection: cut live connections, refuse new ones, drop mid-stream."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``; faults are switched on from the test.

    - :meth:`cut` closes every live connection (both sides), as a broker crash would;
    - ``refuse = True`` closes new connections at once, as a broker that is down;
    - :meth:`drop_on_next_send` closes a connection when its client next sends data,
      without forwarding it: the request is lost in flight;
    - :meth:`drop_next_reply` closes a connection when its server next answers, without
      forwarding the answer: the request was handled, its response is lost.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.refuse = False
        self._drop_next = threading.Event()
        self._drop_reply = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            _close(client)
            _close(server)

    def drop_on_next_send(self) -> None:
        self._drop_next.set()

    def drop_next_reply(self) -> None:
        self._drop_reply.set()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closed = True
        _close(self._server)
        self.cut()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.refuse:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if from_client and self._drop_next.is_set():
                    self._drop_next.clear()
                    break
                if not from_client and self._drop_reply.is_set():
                    self._drop_reply.clear()
                    break
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)
        with self._lock:
            self._pairs = [p for p in self._pairs if source not in p]


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
