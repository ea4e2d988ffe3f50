"""Declare the shop's RabbitMQ exchange and queues (idempotent): ``python -m
examples.order_inventory.topology``, with ``RABBITMQ_URL`` and ``SHOP`` as for the
endpoints. Each queue is bound to the message types its endpoint handles."""

from __future__ import annotations

import os

from docoutbox_rabbitmq import RabbitPublisher
from examples.order_inventory import domain


def declare(url: str, shop: str) -> None:
    with RabbitPublisher(url, exchange=shop) as publisher:
        publisher.declare(
            queues={
                f"{shop}.orders": sorted(domain.orders.types),
                f"{shop}.inventory": sorted(domain.inventory.types),
            }
        )


if __name__ == "__main__":
    declare(
        os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        os.environ.get("SHOP", "shop"),
    )
