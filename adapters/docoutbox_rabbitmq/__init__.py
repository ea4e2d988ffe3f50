"""RabbitMQ adapter for docoutbox: a confirming publisher and a consumer that acks after commit."""

from docoutbox_rabbitmq.consumer import Action, ConsumerStats, RabbitConsumer, Verdict
from docoutbox_rabbitmq.errors import translate, translated
from docoutbox_rabbitmq.publisher import RabbitPublisher, masked, properties_for
from docoutbox_rabbitmq.topology import declare

__all__ = [
    "Action",
    "ConsumerStats",
    "RabbitConsumer",
    "RabbitPublisher",
    "Verdict",
    "declare",
    "masked",
    "properties_for",
    "translate",
    "translated",
]
