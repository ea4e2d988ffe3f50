"""The Order and Inventory endpoints on Cosmos DB + RabbitMQ: only the stores differ from
``mongo.py``.

    docoutbox run examples.order_inventory.cosmos:orders examples.order_inventory.cosmos:inventory

``COSMOS_ENDPOINT``, ``COSMOS_KEY`` and ``RABBITMQ_URL`` come from the environment;
``SHOP`` names the exchange, the queues (``<SHOP>.orders``, ``<SHOP>.inventory``) and the
database (default ``shop``); ``python -m examples.order_inventory.topology`` declares them.
"""

from __future__ import annotations

import os

from docoutbox_app.endpoint import Broker, Endpoint, RabbitQueue, Store, env, payload_field
from examples.order_inventory import domain

SHOP = os.environ.get("SHOP", "shop")
COSMOS = env("COSMOS_ENDPOINT", "https://localhost:8081/")
KEY = env("COSMOS_KEY")
RABBIT = env("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
OUTPUT = Broker("rabbitmq", RABBIT, destination=SHOP)

orders = Endpoint(
    "orders",
    domain.Order,
    domain.orders,
    store=Store("cosmos", COSMOS, SHOP, "orders", key=KEY),
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
    store=Store("cosmos", COSMOS, SHOP, "stock", key=KEY),
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
