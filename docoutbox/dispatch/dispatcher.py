"""The dispatcher: turns committed outbox entries into confirmed publishes, then trims them.

Sources of work: a :class:`~docoutbox.dispatch.ports.ChangeSource` (optional) and sweeps of
documents with pending entries (periodic, with a grace period; on every partition
acquired; and in full whenever the stream position is lost). Each aggregate is handled by
:func:`docoutbox.dispatch.flow.dispatch_document`, run by an :class:`AggregateScheduler`:
concurrent across aggregates, serial per aggregate. The checkpoint moves only past events
whose work is complete (:mod:`docoutbox.dispatch.checkpoint`).

Call :meth:`Dispatcher.run` on a thread of your choice and :meth:`Dispatcher.stop` (for
example from a SIGTERM handler) to finish in-flight work, checkpoint and release leases.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from docoutbox.dispatch.checkpoint import Done, Gate, Sweep
from docoutbox.dispatch.flow import DispatchPolicy
from docoutbox.dispatch.metrics import Metrics, NullMetrics
from docoutbox.dispatch.ownership import Ownership, SoleOwner
from docoutbox.dispatch.ports import ChangeSource, Checkpoints, DeadLetters, Publisher
from docoutbox.dispatch.runner import DispatchRunner
from docoutbox.dispatch.scheduler import AggregateScheduler, Backoff
from docoutbox.dispatch.stream import StreamFollower
from docoutbox.errors import StoreError
from docoutbox.model import AggregateId
from docoutbox.store.document import ID, Document, partition_of, utcnow
from docoutbox.store.ports import StoreBackend

log = logging.getLogger("docoutbox.dispatcher")


@dataclass(frozen=True)
class DispatcherConfig:
    name: str = "docoutbox"
    #: Must equal the stores' ``StoreConfig.partitions``.
    partitions: int = 16
    concurrency: int = 8
    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    sweep_interval: float = 60.0
    grace: float = 30.0
    poll_interval: float = 0.05
    batch_size: int = 500
    sweep_page: int = 100
    max_outstanding: int = 10_000
    max_backlog: int = 1_000
    checkpoint_interval: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)

    @classmethod
    def polling(cls, interval: float = 1.0, **options: Any) -> DispatcherConfig:
        """Polling mode, for deployments without change streams: sweep every ``interval``
        seconds with no grace period, so a new entry is published within about
        ``interval``. A :class:`Dispatcher` without a change source uses it by default."""
        return cls(sweep_interval=interval, grace=0.0, **options)


def event_target(doc: Document | None, partitions: int) -> tuple[AggregateId, int] | None:
    """The aggregate and partition of a document with pending entries, else None."""
    if not doc or not doc.get("outbox"):
        return None
    aggregate_id = doc.get(ID)
    if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
        return None
    partition = doc.get("partition")
    if isinstance(partition, bool) or not isinstance(partition, int):
        partition = partition_of(aggregate_id, partitions)
    return aggregate_id, partition % partitions


class Dispatcher:
    def __init__(
        self,
        backend: StoreBackend,
        publisher: Publisher,
        dead_letters: DeadLetters,
        *,
        source: ChangeSource | None = None,
        checkpoints: Checkpoints | None = None,
        ownership: Ownership | None = None,
        config: DispatcherConfig | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or (
            DispatcherConfig() if source is not None else DispatcherConfig.polling()
        )
        self.backend = backend
        self.source = source
        self.checkpoints = checkpoints
        self.ownership = ownership or SoleOwner()
        self.metrics = metrics or NullMetrics()
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._crashed = threading.Event()
        self.runner = DispatchRunner(
            backend,
            publisher,
            dead_letters,
            self.ownership,
            policy=self.config.policy,
            metrics=self.metrics,
            stop=self._stop,
            crashed=self._crashed,
            clock=utcnow,
            rng=self._rng,
        )
        self.scheduler = AggregateScheduler(
            self.runner.run,
            workers=self.config.concurrency,
            backoff=self.config.backoff,
            rng=self._rng,
        )
        self.sweeps: deque[Sweep] = deque()
        self.follower: StreamFollower | None = None
        if source is not None:
            cfg = self.config
            self.follower = StreamFollower(
                source,
                checkpoints,
                cfg.name,
                request=self._request_for,
                sweep_all=lambda gate: self.sweeps.append(
                    Sweep(self.ownership.owned(), None, gate)
                ),
                batch_size=cfg.batch_size,
                max_outstanding=cfg.max_outstanding,
                checkpoint_interval=cfg.checkpoint_interval,
                backoff=cfg.backoff,
                rng=self._rng,
            )
        self._next_sweep = 0.0
        self.started = threading.Event()

    def stop(self) -> None:
        """Stop taking work; :meth:`run` finishes in-flight work, checkpoints and returns."""
        self._stop.set()

    def halt(self) -> None:
        """Stop as abruptly as a crash: abandon work, no checkpoint, keep the leases."""
        self._crashed.set()
        self._stop.set()

    def run(self) -> None:
        cfg = self.config
        log.info(
            "dispatcher_started name=%s partitions=%d concurrency=%d stream=%s",
            cfg.name,
            cfg.partitions,
            cfg.concurrency,
            self.source is not None,
        )
        self.ownership.start()
        self._next_sweep = time.monotonic() + cfg.sweep_interval
        if self.follower is None:
            self.sweeps.append(Sweep(self.ownership.owned(), None))
        self.started.set()
        try:
            while not self._stop.is_set():
                busy = self._step()
                if not busy:
                    self._stop.wait(cfg.poll_interval)
        finally:
            self._shutdown()

    # -- one turn of the loop ---------------------------------------------------------

    def _step(self) -> bool:
        now = time.monotonic()
        for scope in self.ownership.take_acquired():
            self.sweeps.append(Sweep(scope, None))
        if now >= self._next_sweep:
            self._next_sweep = now + self.config.sweep_interval
            self._queue_periodic_sweep()
        self.scheduler.pump()
        busy = self._sweep_step()
        if self.follower is not None:
            busy = self.follower.step(now) or busy
            self.follower.checkpoint(now)
        self.metrics.backlog(self.scheduler.backlog())
        return busy

    def _queue_periodic_sweep(self) -> None:
        scope = self.ownership.owned()
        if scope is not None and not scope:
            return
        if any(s.gate is None and s.older_than is not None for s in self.sweeps):
            return
        older_than = utcnow() - timedelta(seconds=self.config.grace)
        self.sweeps.append(Sweep(scope, older_than))

    def _sweep_step(self) -> bool:
        if not self.sweeps or self.scheduler.backlog() >= self.config.max_backlog:
            return False
        sweep = self.sweeps[0]
        partitions = None if sweep.scope is None else sorted(sweep.scope)
        try:
            docs = self.backend.find_pending(
                after=sweep.after,
                limit=self.config.sweep_page,
                older_than=sweep.older_than,
                partitions=partitions,
            )
        except StoreError as exc:
            log.warning("sweep_failed error=%r", exc)
            return False
        for doc in docs:
            done = self._request_for(doc)
            if done is not None:
                sweep.requested += 1
                if sweep.gate is not None:
                    sweep.gate.add(done)
        sweep.pages += 1
        if docs:
            sweep.after = docs[-1][ID]
        if len(docs) < self.config.sweep_page:
            self.sweeps.popleft()
            if sweep.gate is not None:
                sweep.gate.finished = True
            log.info(
                "sweep_done scope=%s grace=%s aggregates=%d",
                "all" if sweep.scope is None else sorted(sweep.scope),
                sweep.older_than is not None,
                sweep.requested,
            )
        return True

    def _sweep_all(self, gate: Gate) -> None:
        self.sweeps.append(Sweep(self.ownership.owned(), None, gate))

    def _request_for(self, doc: Document | None) -> Done | None:
        """Ask for a run of the document's aggregate if it has pending entries and is ours."""
        target = event_target(doc, self.config.partitions)
        if target is None or not self.ownership.valid(target[1]):
            return None
        return partial(self.scheduler.done, self.scheduler.request(*target))

    def _shutdown(self) -> None:
        crashed = self._crashed.is_set()
        log.info("dispatcher_stopping name=%s crashed=%s", self.config.name, crashed)
        self.scheduler.close()
        if self.follower is not None and not crashed:
            self.follower.checkpoint(time.monotonic(), force=True)
        self.ownership.stop(release=not crashed)
        if self.follower is not None:
            self.follower.close()
        saved = self.follower.saved if self.follower is not None else None
        log.info("dispatcher_stopped name=%s checkpoint=%r", self.config.name, saved)
