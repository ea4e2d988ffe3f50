"""Kafka adapter for docoutbox: an idempotent, confirming publisher and a consumer that
commits offsets after the store's commit.

- :mod:`docoutbox_kafka.publisher`: :class:`KafkaPublisher`, :class:`AsyncKafkaPublisher`;
- :mod:`docoutbox_kafka.consumer` and :mod:`docoutbox_kafka.aio`: :class:`KafkaConsumer`,
  :class:`AsyncKafkaConsumer`; :mod:`docoutbox_kafka.offsets`: which offsets may commit;
- :mod:`docoutbox_kafka.records`: entries as records (key, headers, body);
- :mod:`docoutbox_kafka.broker`: the ``docoutbox.brokers`` adapter;
- :mod:`docoutbox_kafka.errors`: the one translation of client errors.
"""

from docoutbox_kafka.aio import AsyncKafkaConsumer
from docoutbox_kafka.consumer import ConsumerStats, KafkaConsumer
from docoutbox_kafka.publisher import AsyncKafkaPublisher, KafkaPublisher

__all__ = [
    "AsyncKafkaConsumer",
    "AsyncKafkaPublisher",
    "ConsumerStats",
    "KafkaConsumer",
    "KafkaPublisher",
]
