"""What ``docoutbox dispatch`` shows of itself: progress lines with an ETA, the measured
outbox backlog, Prometheus metrics, health endpoints and OpenTelemetry.

Rule: the backlog is measured in the database every ``--backlog-interval`` seconds, or
every ``--progress-interval`` seconds when progress lines are more frequent, so that each
line carries a fresh measurement; the last line, on stop, measures once more (never
inferred from the in-memory work queue). With it, the pending work per partition or feed
range, where the store's kit measures it.
"""

from __future__ import annotations

import argparse
from typing import Any

from docoutbox.dispatch.engine.backlog import BacklogMonitor, BacklogProbe, Fanout, ProgressMetrics
from docoutbox.dispatch.engine.lag import PendingWorkProbe
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.observability.health import Endpoint, Health, Observed
from docoutbox_app.cli.options import INTERVAL, PORT


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument(
        "--metrics-port",
        type=PORT,
        help="serve /metrics (Prometheus; needs docoutbox[prometheus]), /healthz, /readyz "
        "and /health on this port (0: any free port)",
    )
    d.add_argument("--metrics-host", default="127.0.0.1", help="address to serve them on")
    d.add_argument(
        "--backlog-interval",
        type=INTERVAL,
        default=5.0,
        help="seconds between measurements of the outbox backlog in the database (at most "
        "--progress-interval: each progress line shows a fresh one)",
    )
    d.add_argument("--log-format", choices=["text", "json"], default="text", help="log lines")
    d.add_argument(
        "--otel",
        action="store_true",
        help="trace publishes and report metrics through OpenTelemetry (needs "
        "docoutbox[otel]; configure the SDK and exporters as usual)",
    )


class Observability:
    """Builds the dispatcher's metrics and the monitor, endpoint and tracing around it."""

    def __init__(
        self, args: argparse.Namespace, probe: BacklogProbe, work: PendingWorkProbe | None = None
    ) -> None:
        """Raises ValueError for bad settings, ImportError for a missing extra."""
        if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
            raise ValueError("--metrics-port must be between 0 and 65535")
        if not args.backlog_interval > 0 or not args.progress_interval > 0:
            raise ValueError("--backlog-interval and --progress-interval must be positive")
        self.args = args
        self.progress = ProgressMetrics(every=args.progress_interval)
        self.health = Health()
        targets: list[Metrics] = [self.progress, self.health]
        self.prometheus: Any = None
        if args.metrics_port is not None:
            from docoutbox.observability.prometheus import PrometheusMetrics  # noqa: PLC0415

            self.prometheus = PrometheusMetrics()
            targets.append(self.prometheus)
        if args.otel:
            from docoutbox.observability.otel import OtelMetrics  # noqa: PLC0415

            targets.append(OtelMetrics())
        self.metrics = Fanout(*targets)
        every = min(args.backlog_interval, args.progress_interval)
        self.monitor = BacklogMonitor(probe, self.metrics, interval=every, work=work)
        self.health.monitor = self.monitor
        self.endpoint: Endpoint | None = None

    def publisher(self, publisher: Any, system: str | None) -> Any:
        if not self.args.otel:
            return publisher
        from docoutbox.observability.otel import TracingPublisher  # noqa: PLC0415

        return TracingPublisher(publisher, system=system)

    def attach(self, dispatcher: Observed) -> None:
        """Report on ``dispatcher`` (threaded or asyncio) from now on."""
        self.health.dispatcher = dispatcher
        if self.prometheus is not None:
            self.prometheus.watch_queue(dispatcher.queued)

    def start(self, dispatcher: Observed | None) -> None:
        """Measure once, then serve (raises OSError if the port cannot be bound).

        Until a dispatcher is given here or to :meth:`attach` (the asyncio one is built
        inside its event loop), health reports "down"; metrics are served.
        """
        if dispatcher is not None:
            self.attach(dispatcher)
        self.monitor.start()
        if self.args.metrics_port is not None:
            exposition = self.prometheus.exposition if self.prometheus is not None else None
            self.endpoint = Endpoint(
                self.args.metrics_port,
                self.args.metrics_host,
                health=self.health,
                exposition=exposition,
            ).start()

    def close(self) -> None:
        """Stop measuring and serving, and log the last progress line, measured now."""
        self.monitor.stop()
        if self.endpoint is not None:
            self.endpoint.close()
        self.progress.final(self.monitor.measure(report=False))
