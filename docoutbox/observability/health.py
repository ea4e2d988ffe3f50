"""The dispatcher's health, and an HTTP endpoint serving it beside ``/metrics``.

- ``/healthz`` (liveness): 200 while the dispatcher loop runs;
- ``/readyz`` (readiness): 200 when it runs, its change stream is open (if it follows
  one), and the broker is not known to be down (the last publish attempt did not fail with
  :class:`~docoutbox.errors.BrokerUnavailable`);
- ``/health``: the same checks as JSON, with the leases held and the last backlog
  measurement;
- ``/metrics``: whatever ``exposition`` returns (Prometheus text format).

:class:`Health` is also a :class:`~docoutbox.dispatch.engine.metrics.Metrics`, so it learns the
broker's state from the publishes themselves (a health check must not use the publisher's
connections, which belong to the worker threads). Standard library only.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from docoutbox.dispatch.engine.backlog import BacklogMonitor
from docoutbox.errors import BrokerUnavailable
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.ports.dispatch import Ownership

log = logging.getLogger("docoutbox.health")

Exposition = Callable[[], tuple[bytes, str]]


class Observed(Protocol):
    """What health reads of a dispatcher: the threaded
    :class:`~docoutbox.dispatch.drivers.threads.Dispatcher` and the asyncio
    :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher` both have it."""

    started: threading.Event
    ownership: Ownership

    @property
    def stopping(self) -> bool: ...

    @property
    def stream_open(self) -> bool | None: ...

    def queued(self) -> int: ...


class Health:
    def __init__(
        self, dispatcher: Observed | None = None, monitor: BacklogMonitor | None = None
    ) -> None:
        #: May be set after construction (the dispatcher takes this as its metrics).
        self.dispatcher = dispatcher
        self.monitor = monitor
        self._lock = threading.Lock()
        self._broker: bool | None = None
        self._broker_error: str | None = None

    # -- Metrics: the broker's state as the publishes see it ----------------------------

    def published(self, entry: OutboxMessage, lag: float) -> None:
        with self._lock:
            self._broker, self._broker_error = True, None

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        if isinstance(error, BrokerUnavailable):
            with self._lock:
                self._broker, self._broker_error = False, f"{type(error).__name__}: {error}"

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        return None

    def backlog(self, aggregates: int) -> None:
        return None

    # -- checks -------------------------------------------------------------------------

    def live(self) -> bool:
        d = self.dispatcher
        return d is not None and d.started.is_set() and not d.stopping

    def report(self) -> dict[str, Any]:
        d = self.dispatcher
        if d is None:
            return {"status": "down", "live": False, "ready": False}
        with self._lock:
            broker, broker_error = self._broker, self._broker_error
        owned = d.ownership.owned()
        stream = d.stream_open
        live = self.live()
        ready = live and stream is not False and broker is not False
        report: dict[str, Any] = {
            "status": "ready" if ready else ("live" if live else "down"),
            "live": live,
            "ready": ready,
            "stream_open": stream,
            "broker_connected": broker,
            "broker_error": broker_error,
            "leases": "all" if owned is None else sorted(owned),
            "queued": d.queued(),
        }
        monitor = self.monitor
        if monitor is not None:
            stats = monitor.last
            report["backlog"] = None if stats is None else stats.to_json()
            report["backlog_measure_failures"] = monitor.failures
        return report


class _Handler(BaseHTTPRequestHandler):
    health: Health | None = None
    exposition: Exposition | None = None

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        health = self.health
        if path == "/metrics" and self.exposition is not None:
            body, kind = self.exposition()
            self._send(200, body, kind)
        elif path in ("/healthz", "/readyz", "/health") and health is not None:
            report = health.report()
            ok = report["live"] if path == "/healthz" else report["ready"]
            if path == "/health":
                ok = True
            body = json.dumps(report, default=str).encode()
            self._send(200 if ok else 503, body, "application/json")
        else:
            self._send(404, b"not found\n", "text/plain")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http " + format, *args)


class Endpoint:
    """A threaded HTTP server for health and metrics; ``port=0`` picks a free port."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *,
        health: Health | None = None,
        exposition: Exposition | None = None,
    ) -> None:
        serve = staticmethod(exposition) if exposition is not None else None
        handler = type("Handler", (_Handler,), {"health": health, "exposition": serve})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="docoutbox-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Endpoint:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
