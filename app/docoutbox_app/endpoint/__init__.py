"""Endpoints: one unit that receives, handles exactly once and sends.

An :class:`Endpoint` declares an aggregate store, its handlers, its inputs (RabbitMQ
queues, Kafka topics: the routing from a message to its aggregate and the types that may
create one) and the outbox's output. ``docoutbox run module:endpoint ...`` runs endpoints
in one process (:func:`serve`); :mod:`docoutbox_app.testing` runs them in memory.

Modules:

- :mod:`~docoutbox_app.endpoint.definition`: the declarations, checked at construction;
- :mod:`~docoutbox_app.endpoint.runtime`: consumers, dispatcher, health, shutdown.
"""

from docoutbox_app.endpoint.definition import (
    Broker,
    Endpoint,
    EndpointConfigError,
    Env,
    KafkaTopic,
    RabbitQueue,
    Store,
    env,
    payload_field,
)
from docoutbox_app.endpoint.runtime import serve

__all__ = [
    "Broker",
    "Endpoint",
    "EndpointConfigError",
    "Env",
    "KafkaTopic",
    "RabbitQueue",
    "Store",
    "env",
    "payload_field",
    "serve",
]
