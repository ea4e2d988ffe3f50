"""The publishing connection reads a broker URL as aio-pika does: host, port, PLAIN
credentials, virtual host, ``heartbeat``, and for ``amqps`` the TLS options; a value it
cannot use is an ``InvalidConfig`` when the publisher is made, not at its first publish."""

from __future__ import annotations

import ssl

import pytest

from docoutbox.errors import InvalidConfig
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.link import Address


def test_defaults_and_percent_encoded_parts() -> None:
    plain = Address.of("amqp://broker")
    assert (plain.host, plain.port, plain.username, plain.password) == (
        "broker",
        5672,
        "guest",
        "guest",
    )
    assert plain.vhost == "/" and plain.heartbeat is None and plain.tls is None
    named = Address.of("amqp://us%40er:p%2Fss@127.0.0.1:5673/%2F?heartbeat=5")
    assert (named.username, named.password, named.port) == ("us@er", "p/ss", 5673)
    assert named.vhost == "/" and named.heartbeat == 5
    assert Address.of("amqp://h/shop").vhost == "shop"
    assert Address.of("amqp://h/?heartbeat=0").heartbeat == 0


def test_amqps_verifies_by_default_and_not_with_no_verify_ssl() -> None:
    secure = Address.of("amqps://h")
    assert secure.port == 5671 and isinstance(secure.tls, ssl.SSLContext)
    assert secure.tls.verify_mode is ssl.CERT_REQUIRED and secure.tls.check_hostname
    unverified = Address.of("amqps://h:5999/?no_verify_ssl=1")
    assert unverified.tls is not None and unverified.tls.verify_mode is ssl.CERT_NONE
    assert not unverified.tls.check_hostname and unverified.port == 5999


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://h/?heartbeat=soon", "heartbeat"),
        ("amqps://h/?cafile=/nonexistent/ca.pem", "TLS files"),
        ("amqps://h/?certfile=/nonexistent/cert.pem", "TLS files"),
    ],
)
def test_unusable_url_options_are_refused_when_the_publisher_is_made(url: str, says: str) -> None:
    with pytest.raises(InvalidConfig, match=says):
        AsyncRabbitPublisher(url, "ex")
