"""The Kafka adapter as the ``docoutbox.brokers`` entry point ``kafka`` names it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from docoutbox.ports.kit import BrokerSettings
from docoutbox_kafka.publisher import KafkaPublisher
from docoutbox_kafka.records import client_settings

#: What a dispatcher's publisher sets unless ``options`` do: it publishes in rounds, whose
#: records then share produce requests (the Kafka how-to: 5 ms of latency per round against
#: librdkafka's CPU per record). ``KafkaPublisher`` itself does not linger.
DISPATCH_DEFAULTS: Mapping[str, Any] = {"linger.ms": 5}


class KafkaBroker:
    """:class:`~docoutbox.ports.kit.BrokerAdapter`: ``url`` is the bootstrap servers,
    ``destination`` the topic of entries without a destination (None: their type),
    ``options`` librdkafka settings (``linger.ms`` 5 unless they set it; the idempotent
    producer's own settings cannot be changed)."""

    label = "Kafka"
    extra = "kafka"

    def publisher(self, settings: BrokerSettings) -> KafkaPublisher:
        config = {**DISPATCH_DEFAULTS, **client_settings(settings.url), **settings.options}
        kafka = KafkaPublisher(config, settings.destination, wire=settings.wire)
        try:
            kafka.check(timeout=settings.timeout)
        except BaseException:
            kafka.close()
            raise
        return kafka


#: The adapter the ``docoutbox.brokers`` entry point ``kafka`` names.
BROKER = KafkaBroker()
