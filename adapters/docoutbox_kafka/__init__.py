"""Kafka adapter for docoutbox: an idempotent, confirming publisher and a consumer that
commits offsets after the store's commit."""

from docoutbox_kafka.aio import AsyncKafkaConsumer
from docoutbox_kafka.consumer import ConsumerStats, KafkaConsumer
from docoutbox_kafka.errors import translate, translate_error, translated
from docoutbox_kafka.publisher import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_kafka.records import headers_for, masked_config, record_for

__all__ = [
    "AsyncKafkaConsumer",
    "AsyncKafkaPublisher",
    "ConsumerStats",
    "KafkaConsumer",
    "KafkaPublisher",
    "headers_for",
    "masked_config",
    "record_for",
    "translate",
    "translate_error",
    "translated",
]
