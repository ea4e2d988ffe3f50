"""Running endpoints in one process: consumers, dispatchers, health, graceful shutdown.

Rule: an endpoint stops in this order, and only in this order: its consumers stop taking
deliveries and finish the one in hand (acked after its commit, or given back); then its
dispatcher finishes the publishes in flight (waiting for their confirms), saves its
checkpoint and releases its leases; then the publisher and the store are closed. A failure
of one endpoint stops them all, the same way, and is raised from :func:`serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.dispatch.engine.backlog import Fanout
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.errors import BrokerUnavailable
from docoutbox.observability.health import Endpoint as HttpEndpoint
from docoutbox.observability.health import Health
from docoutbox.ports.dispatch import AsyncPublisher, Publisher
from docoutbox.ports.kit import AsyncStoreKit
from docoutbox.receive import ConsumerStats
from docoutbox.store.api import AsyncAggregateStore
from docoutbox_app import registry
from docoutbox_app.endpoint.definition import (
    Broker,
    Endpoint,
    EndpointConfigError,
    Input,
    RabbitQueue,
    Settings,
)
from docoutbox_app.wiring import DispatchOptions, build_async_dispatcher

log = logging.getLogger("docoutbox.endpoint")

#: Seconds between attempts to reach a broker an input lost.
RECONNECT_DELAY = 1.0
#: The longest wait between reads of the change stream that bring nothing, unless the
#: endpoint's :class:`~docoutbox_app.wiring.DispatchOptions` say: the endpoint's own
#: commits of new entries wake its dispatcher at once, so the waits only delay entries
#: committed by other processes, after a quiet spell. MongoDB itself holds an empty read
#: for 1 s (``maxAwaitTimeMS``'s default), so there it delays nothing.
STREAM_WAIT = 1.0


class EndpointHealth(Health):
    """One endpoint's health: its dispatcher's (as :class:`Health`) and its consumers'."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        #: Per input label: whether its consumer is connected and consuming.
        self.inputs: dict[str, bool] = {}
        self.stats: dict[str, ConsumerStats] = {}

    def report(self) -> dict[str, Any]:
        report = super().report()
        consuming = all(self.inputs.values()) and bool(self.inputs)
        report["inputs"] = dict(self.inputs)
        report["consumed"] = {
            label: {"applied": s.applied, "duplicates": s.duplicates, "rejected": s.rejected}
            for label, s in self.stats.items()
        }
        report["ready"] = bool(report["ready"]) and consuming
        if report["status"] == "ready" and not consuming:
            report["status"] = "live"
        return report


class ProcessHealth(Health):
    """The health of every endpoint of the process: live and ready when all of them are."""

    def __init__(self) -> None:
        super().__init__()
        self.endpoints: dict[str, EndpointHealth] = {}

    def report(self) -> dict[str, Any]:
        reports = {name: health.report() for name, health in self.endpoints.items()}
        live = bool(reports) and all(r["live"] for r in reports.values())
        ready = live and all(r["ready"] for r in reports.values())
        return {
            "status": "ready" if ready else ("live" if live else "down"),
            "live": live,
            "ready": ready,
            "endpoints": reports,
        }


@dataclass
class Observation:
    """What the process reports: health (always), Prometheus metrics (when installed and
    served), shared by its endpoints."""

    health: ProcessHealth = field(default_factory=ProcessHealth)
    prometheus: Any = None

    def metrics_for(self, endpoint: str) -> tuple[EndpointHealth, Metrics]:
        health = EndpointHealth(endpoint)
        self.health.endpoints[endpoint] = health
        metrics: Metrics = health if self.prometheus is None else Fanout(health, self.prometheus)
        return health, metrics


async def _open_kit(endpoint: Endpoint[Any], settings: Settings) -> AsyncStoreKit:
    if settings.store is None:
        assert isinstance(endpoint.store, AsyncStoreKit)
        return endpoint.store
    assert not isinstance(endpoint.store, AsyncStoreKit)
    return await registry.store(endpoint.store.adapter).open_async(settings.store)


async def _open_publisher(
    endpoint: Endpoint[Any], settings: Settings
) -> Publisher | AsyncPublisher:
    if settings.output is None:
        assert not isinstance(endpoint.output, Broker)
        return endpoint.output
    assert isinstance(endpoint.output, Broker)
    adapter = registry.broker(endpoint.output.adapter)
    return await asyncio.to_thread(adapter.publisher, settings.output)


def _consumer(
    endpoint: Endpoint[Any],
    item: Input,
    url: str | None,
    store: AsyncAggregateStore[Any],
    kit: AsyncStoreKit,
) -> Any:
    common: dict[str, Any] = {
        "aggregate_id_of": item.route,
        "creates": item.creates,
        "retry": endpoint.retry,
        "dead_letters": kit.dead_letters,
    }
    if isinstance(item, RabbitQueue):
        from docoutbox_rabbitmq.aio import AsyncRabbitConsumer  # noqa: PLC0415 - aio-pika, on use

        assert url is not None
        return AsyncRabbitConsumer(
            url, item.queue, store, endpoint.handlers, prefetch=item.prefetch, **common
        )
    from docoutbox_kafka.aio import AsyncKafkaConsumer  # noqa: PLC0415 - confluent-kafka, on use

    config = url if url is not None else dict(item.config)  # type: ignore[arg-type]
    return AsyncKafkaConsumer(
        config,
        item.topics,
        item.group,
        store,
        endpoint.handlers,
        dead_letter_topic=item.dead_letter_topic,
        **common,
    )


def _options(endpoint: Endpoint[Any]) -> DispatchOptions:
    """The endpoint's dispatch options; its stream waits up to :data:`STREAM_WAIT`
    unless they say otherwise."""
    options = endpoint.dispatch
    if options.max_stream_wait is None:
        return dataclasses.replace(options, max_stream_wait=STREAM_WAIT)
    return options


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _consume(
    endpoint: str, label: str, consumer: Any, stop: asyncio.Event, health: EndpointHealth
) -> None:
    """Run ``consumer`` until ``stop``, reconnecting when its broker goes away."""
    health.stats[label] = consumer.stats
    try:
        while not stop.is_set():
            health.inputs[label] = True
            try:
                await consumer.run(stop=stop)
            except BrokerUnavailable as exc:
                health.inputs[label] = False
                log.warning(
                    "consumer_reconnecting endpoint=%s input=%s error=%s", endpoint, label, exc
                )
                await _wait(stop, RECONNECT_DELAY)
    finally:
        health.inputs[label] = False
        stats = consumer.stats
        log.info(
            "consumer_stopped endpoint=%s input=%s applied=%d duplicates=%d rejected=%d",
            endpoint,
            label,
            stats.applied,
            stats.duplicates,
            stats.rejected,
        )
        await consumer.close()


async def _close_publisher(publisher: Publisher | AsyncPublisher) -> None:
    close = getattr(publisher, "close", None)
    if close is None:
        return
    if inspect.iscoroutinefunction(close):
        await close()
    else:
        await asyncio.to_thread(close)


async def run_endpoint(
    endpoint: Endpoint[Any],
    settings: Settings,
    stop: asyncio.Event,
    observation: Observation,
    *,
    started: Callable[[AsyncDispatcher], None] | None = None,
) -> None:
    """Run ``endpoint`` until ``stop`` is set, then shut it down (see the module's rule).

    Raises what stopped it early: a store or broker that cannot be opened, a dispatcher
    that failed, a consumer's permanent store error.
    """
    health, metrics = observation.metrics_for(endpoint.name)
    kit = await _open_kit(endpoint, settings)
    publisher: Publisher | AsyncPublisher | None = None
    try:
        publisher = await _open_publisher(endpoint, settings)
        store = AsyncAggregateStore(kit.backend, endpoint.aggregate, endpoint.config)
        dispatcher = build_async_dispatcher(kit, publisher, _options(endpoint), metrics=metrics)
        # A commit that added entries reads the stream at once (its waits start over).
        store.commit_listeners.append(lambda _: dispatcher.nudge())
        health.dispatcher = dispatcher
        consumers = {
            item.label: _consumer(endpoint, item, settings.inputs.get(item.label), store, kit)
            for item in endpoint.inputs
        }
        dispatching = asyncio.create_task(dispatcher.run(), name=f"{endpoint.name}-dispatch")
        consuming = [
            asyncio.create_task(
                _consume(endpoint.name, label, consumer, stop, health),
                name=f"{endpoint.name}-{label}",
            )
            for label, consumer in consumers.items()
        ]
        log.info(
            "endpoint_started endpoint=%s aggregate=%s inputs=%s",
            endpoint.name,
            endpoint.aggregate.__name__,
            ",".join(consumers),
        )
        if started is not None:
            started(dispatcher)
        failure: BaseException | None = None
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                [stopping, dispatching, *consuming], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task is not stopping and task.exception() is not None:
                    failure = task.exception()
                    log.error(
                        "endpoint_failed endpoint=%s task=%s error=%r",
                        endpoint.name,
                        task.get_name(),
                        failure,
                    )
        finally:
            stop.set()  # one part failing stops the endpoint (and the process's others)
            log.info("endpoint_stopping endpoint=%s", endpoint.name)
            results = await asyncio.gather(*consuming, return_exceptions=True)
            dispatcher.stop()
            results.append((await asyncio.gather(dispatching, return_exceptions=True))[0])
            stopping.cancel()
        for result in results:
            if failure is None and isinstance(result, BaseException):
                failure = result
        if failure is not None:
            raise failure
        log.info("endpoint_stopped endpoint=%s", endpoint.name)
    finally:
        if publisher is not None:
            await _close_publisher(publisher)
        if isinstance(endpoint.store, AsyncStoreKit):
            pass  # a kit given to the endpoint is its owner's to close
        else:
            await kit.close()


async def serve(
    endpoints: Sequence[Endpoint[Any]],
    stop: asyncio.Event,
    *,
    settings: Sequence[Settings] | None = None,
    health_port: int | None = None,
    health_host: str = "127.0.0.1",
    serving: Callable[[int], Awaitable[None] | None] | None = None,
) -> None:
    """Run ``endpoints`` in this event loop until ``stop`` is set (a signal handler sets it
    in ``docoutbox run``), with ``/healthz``, ``/readyz``, ``/health`` and ``/metrics``
    (Prometheus, when ``docoutbox[prometheus]`` is installed) on ``health_port``.

    ``settings`` are the endpoints' :meth:`Endpoint.settings` (read now if not given).
    ``serving(port)`` is called once the health endpoint listens.
    """
    names = [endpoint.name for endpoint in endpoints]
    if len(set(names)) != len(names):
        raise EndpointConfigError(f"two endpoints have the same name: {names}")
    read = list(settings) if settings is not None else [e.settings() for e in endpoints]
    observation = Observation()
    http: HttpEndpoint | None = None
    if health_port is not None:
        exposition = None
        try:
            from docoutbox.observability.prometheus import (  # noqa: PLC0415 - extra, on use
                PrometheusMetrics,
            )

            observation.prometheus = PrometheusMetrics()
            exposition = observation.prometheus.exposition
        except ImportError:
            log.info("metrics_off reason=%s", "prometheus-client is not installed")
        http = HttpEndpoint(
            health_port, health_host, health=observation.health, exposition=exposition
        ).start()
        log.info("endpoint_serving host=%s port=%d", health_host, http.port)
        if serving is not None:
            pending = serving(http.port)
            if pending is not None:
                await pending

    async def guarded(endpoint: Endpoint[Any], each: Settings) -> None:
        try:
            await run_endpoint(endpoint, each, stop, observation)
        except BaseException:
            stop.set()  # an endpoint that cannot run stops the others
            raise

    try:
        results = await asyncio.gather(
            *(guarded(endpoint, each) for endpoint, each in zip(endpoints, read, strict=True)),
            return_exceptions=True,
        )
    finally:
        if http is not None:
            http.close()
    for result in results:
        if isinstance(result, BaseException):
            raise result
