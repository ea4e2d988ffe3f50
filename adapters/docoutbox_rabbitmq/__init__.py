"""RabbitMQ adapter for docoutbox: a confirming publisher and a consumer that acks after commit."""

from docoutbox.receive import Action, Verdict, receive
from docoutbox_rabbitmq.amqp import declare, masked, properties_for
from docoutbox_rabbitmq.consumer import ConsumerStats, RabbitConsumer
from docoutbox_rabbitmq.errors import translate, translated
from docoutbox_rabbitmq.publisher import RabbitPublisher

__all__ = [
    "Action",
    "ConsumerStats",
    "RabbitConsumer",
    "RabbitPublisher",
    "Verdict",
    "declare",
    "masked",
    "properties_for",
    "receive",
    "translate",
    "translated",
]
