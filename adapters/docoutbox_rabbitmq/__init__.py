"""RabbitMQ adapter for docoutbox: a confirming publisher and a consumer that acks after
commit.

- :mod:`docoutbox_rabbitmq.publisher`: :class:`RabbitPublisher` (pika, publisher confirms);
- :mod:`docoutbox_rabbitmq.consumer`: :class:`RabbitConsumer` (ack after commit);
- :mod:`docoutbox_rabbitmq.pipelined`: ``PipelinedRabbitPublisher``, aio-pika on a loop
  thread, for the threaded dispatcher to pipeline confirms;
- :mod:`docoutbox_rabbitmq.handoff`: calls from worker threads handed to that loop
  thread, one wake-up for those that arrive together;
- :mod:`docoutbox_rabbitmq.aio`: the asyncio twins (``AsyncRabbitPublisher``,
  ``AsyncRabbitConsumer``);
- :mod:`docoutbox_rabbitmq.rounds`: a publish round, written once and settled by the
  broker's confirms;
- :mod:`docoutbox_rabbitmq.link`: the publishing connection of the asyncio publisher
  (handshake, TLS, heartbeats, ``connection.blocked``, one confirm-mode channel);
- :mod:`docoutbox_rabbitmq.inbound`: AMQP frames out of the broker's byte stream;
- :mod:`docoutbox_rabbitmq.frames`: the AMQP frames of one ``basic.publish``;
- :mod:`docoutbox_rabbitmq.amqp`: message properties, declarations, masked URLs;
- :mod:`docoutbox_rabbitmq.broker`: the ``docoutbox.brokers`` adapter;
- :mod:`docoutbox_rabbitmq.replay`: republishing dead letters;
- :mod:`docoutbox_rabbitmq.errors`: the one translation of pika errors.
"""

from docoutbox_rabbitmq.amqp import declare
from docoutbox_rabbitmq.consumer import ConsumerStats, RabbitConsumer
from docoutbox_rabbitmq.publisher import RabbitPublisher

__all__ = ["ConsumerStats", "RabbitConsumer", "RabbitPublisher", "declare"]
