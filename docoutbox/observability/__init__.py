"""Seeing the outbox from outside: OpenTelemetry, Prometheus and health.

Each module needs its optional extra and is imported only by those who ask for it:

- :mod:`docoutbox.observability.otel` (``docoutbox[otel]``): the handling span and the W3C
  trace context in every emitted entry, the publish span, and metrics through the
  OpenTelemetry meter;
- :mod:`docoutbox.observability.prometheus` (``docoutbox[prometheus]``): the same figures
  as Prometheus metrics;
- :mod:`docoutbox.observability.health`: the dispatcher's liveness and readiness, and a
  small HTTP endpoint serving them beside ``/metrics`` (standard library only).
"""
