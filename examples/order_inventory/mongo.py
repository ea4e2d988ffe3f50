"""The Order and Inventory endpoints on MongoDB + RabbitMQ.

    docoutbox run examples.order_inventory.mongo:orders examples.order_inventory.mongo:inventory

``MONGODB_URI`` and ``RABBITMQ_URL`` come from the environment; ``SHOP`` names the
exchange, the queues (``<SHOP>.orders``, ``<SHOP>.inventory``) and the database (default
``shop``); ``python -m examples.order_inventory.topology`` declares them.
"""

from __future__ import annotations

import os

from docoutbox_app.endpoint import Broker, Endpoint, RabbitQueue, Store, env, payload_field
from examples.order_inventory import domain

SHOP = os.environ.get("SHOP", "shop")
MONGO = env("MONGODB_URI", "mongodb://127.0.0.1:27017")
RABBIT = env("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
OUTPUT = Broker("rabbitmq", RABBIT, destination=SHOP)

orders = Endpoint(
    "orders",
    domain.Order,
    domain.orders,
    store=Store("mongo", MONGO, SHOP, "orders"),
    inputs=[
        RabbitQueue(
            queue=f"{SHOP}.orders",
            url=RABBIT,
            route=payload_field("order_id"),
            creates={"PlaceOrder"},
        )
    ],
    output=OUTPUT,
)

inventory = Endpoint(
    "inventory",
    domain.Stock,
    domain.inventory,
    store=Store("mongo", MONGO, SHOP, "stock"),
    inputs=[
        RabbitQueue(
            queue=f"{SHOP}.inventory",
            url=RABBIT,
            route=payload_field("sku"),
            creates={"Restock", "ReserveStock"},
        )
    ],
    output=OUTPUT,
)
