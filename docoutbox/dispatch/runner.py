"""One dispatch run of one aggregate: reload it, then drive the pure dispatch flow.

:class:`DispatchRunner` is the sync driver of :func:`docoutbox.dispatch.flow.dispatch_document`:
it publishes through the :class:`~docoutbox.dispatch.ports.Publisher`, quarantines through the
:class:`~docoutbox.dispatch.ports.DeadLetters`, trims through the store backend, and stops touching
the aggregate as soon as its partition is no longer held.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from docoutbox.dispatch.flow import (
    DispatchOp,
    DispatchPolicy,
    DispatchResult,
    Publish,
    Quarantine,
    dispatch_document,
)
from docoutbox.dispatch.metrics import Metrics
from docoutbox.dispatch.ownership import Ownership
from docoutbox.dispatch.ports import DeadLetters, Publisher
from docoutbox.dispatch.scheduler import RunOutcome
from docoutbox.errors import BrokerUnavailable, StoreError
from docoutbox.model import AggregateId
from docoutbox.store.core import Sleep, Write
from docoutbox.store.ports import StoreBackend

log = logging.getLogger("docoutbox.dispatcher")

DispatchFlow = Any  # Generator[DispatchOp, Any, DispatchResult]


class DispatchRunner:
    def __init__(
        self,
        backend: StoreBackend,
        publisher: Publisher,
        dead_letters: DeadLetters,
        ownership: Ownership,
        *,
        policy: DispatchPolicy,
        metrics: Metrics,
        stop: threading.Event,
        crashed: threading.Event,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> None:
        self.backend = backend
        self.publisher = publisher
        self.dead_letters = dead_letters
        self.ownership = ownership
        self.broker = BrokerState()
        self.policy = policy
        self.metrics = metrics
        self._stop = stop
        self._crashed = crashed
        self._clock = clock
        self._rng = rng

    def run(self, aggregate_id: AggregateId, partition: int) -> RunOutcome:
        """Publish and trim what the aggregate has pending now."""
        if not self.ownership.enter(partition):
            return RunOutcome.DONE  # not ours: its owner sweeps it when acquiring
        try:
            doc = self.backend.load(aggregate_id)
            if doc is None or not doc.get("outbox"):
                return RunOutcome.DONE
            flow = dispatch_document(doc, self.policy, self._rng)
            result = self._drive(flow, partition)
        except StoreError as exc:
            log.warning("dispatch_store_error aggregate=%r error=%r", aggregate_id, exc)
            return RunOutcome.RETRY
        finally:
            self.ownership.leave(partition)
        if isinstance(result, RunOutcome):
            return result
        log.debug(
            "dispatched aggregate=%r published=%d quarantined=%d held=%d",
            aggregate_id,
            len(result.published),
            len(result.quarantined),
            len(result.held),
        )
        return RunOutcome.UNAVAILABLE if result.unavailable else RunOutcome.DONE

    def _drive(self, flow: DispatchFlow, partition: int) -> DispatchResult | RunOutcome:
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                op: DispatchOp = flow.send(send) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: DispatchResult = stop.value
                return result
            send, error = None, None
            if isinstance(op, Publish | Write):
                if self._crashed.is_set():
                    flow.close()
                    return RunOutcome.STOPPED
                if not self.ownership.valid(partition):
                    flow.close()  # the partition's next owner sweeps it
                    log.info("dispatch_abandoned partition=%d reason=lease", partition)
                    return RunOutcome.DONE
            if isinstance(op, Publish):
                error = self._publish(op)
            elif isinstance(op, Quarantine):
                self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
                self.metrics.quarantined(op.aggregate_id, _entry_id(op.entry), op.error)
                log.error(
                    "quarantined aggregate=%r entry=%s attempts=%d error=%s",
                    op.aggregate_id,
                    _entry_id(op.entry),
                    op.attempts,
                    op.error,
                )
            elif isinstance(op, Write):
                send = self.backend.write(op.plan)
            elif isinstance(op, Sleep) and self._stop.wait(op.seconds):
                flow.close()
                return RunOutcome.STOPPED

    def _publish(self, op: Publish) -> BaseException | None:
        entry = op.entry
        try:
            self.publisher.publish(entry)
        except Exception as exc:  # noqa: BLE001 - thrown into the flow, which classifies it
            self.metrics.failed(entry, exc)
            if isinstance(exc, BrokerUnavailable):
                self.broker.down(exc)
            else:
                log.warning(
                    "publish_failed aggregate=%r entry=%s seq=%d error=%r",
                    entry.aggregate_id,
                    entry.id,
                    entry.seq,
                    exc,
                )
            return exc
        self.broker.up()
        lag = (self._clock() - entry.created_at).total_seconds()
        self.metrics.published(entry, lag)
        return None


class BrokerState:
    """Logs the broker going down and coming back once each, not once per attempt."""

    def __init__(self) -> None:
        self._down = False
        self._lock = threading.Lock()

    def down(self, exc: BaseException) -> None:
        with self._lock:
            changed, self._down = not self._down, True
        if changed:
            log.warning("broker_unavailable error=%s; entries stay pending", exc)

    def up(self) -> None:
        if not self._down:
            return
        with self._lock:
            changed, self._down = self._down, False
        if changed:
            log.warning("broker_available_again")


def _entry_id(entry: dict[str, Any]) -> str | None:
    value = entry.get("id")
    return value if isinstance(value, str) else None
