"""The Kafka adapter as the ``docoutbox.brokers`` entry point ``kafka`` names it."""

from __future__ import annotations

from docoutbox.ports.kit import BrokerSettings
from docoutbox_kafka.publisher import KafkaPublisher


class KafkaBroker:
    """:class:`~docoutbox.ports.kit.BrokerAdapter`: ``url`` is the bootstrap servers,
    ``destination`` the topic of entries without a destination (None: their type)."""

    label = "Kafka"
    extra = "kafka"

    def publisher(self, settings: BrokerSettings) -> KafkaPublisher:
        kafka = KafkaPublisher(settings.url, settings.destination, wire=settings.wire)
        try:
            kafka.check(timeout=settings.timeout)
        except BaseException:
            kafka.close()
            raise
        return kafka


#: The adapter the ``docoutbox.brokers`` entry point ``kafka`` names.
BROKER = KafkaBroker()
