"""What an endpoint is made of: plain, checked declarations, and no I/O.

Rule: everything an :class:`Endpoint` declares is checked when it is constructed (a wrong
type, a creating type without a handler, two inputs on one queue), so a misconfigured
module fails at import with one clear :class:`EndpointConfigError`; secrets are
:class:`Env` references, read from the environment only when the endpoint starts
(:meth:`Endpoint.settings`) and never part of a ``repr``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel

from docoutbox.errors import InvalidConfig
from docoutbox.handlers import Handler, Handlers
from docoutbox.model import AggregateId, Message
from docoutbox.ports.dispatch import AsyncPublisher, Publisher
from docoutbox.ports.kit import AsyncStoreKit, BrokerSettings, StoreSettings
from docoutbox.receive import HandlerRetry, creating_types
from docoutbox.store.core import StoreConfig
from docoutbox_app.logs import secrets_of
from docoutbox_app.wiring import DispatchOptions

S = TypeVar("S", bound=BaseModel)

#: The RabbitMQ URL of inputs and outputs that name none.
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"


class EndpointConfigError(InvalidConfig):
    """An endpoint declared or configured wrongly; the message says which and how."""


@dataclass(frozen=True)
class Env:
    """A value read from the environment variable ``name`` when the endpoint starts
    (``default`` if it is unset; without a default, an unset variable is an error)."""

    name: str
    default: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name:
            raise EndpointConfigError(f"Env needs a variable name, got {self.name!r}")

    def read(self, what: str) -> str:
        value = os.environ.get(self.name, self.default)
        if value is None:
            raise EndpointConfigError(f"{what}: environment variable {self.name} is not set")
        return value


def env(name: str, default: str | None = None) -> Env:
    """The value of the environment variable ``name``, read when the endpoint starts."""
    return Env(name, default)


Text = str | Env


def _text(value: object, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, Env):
        return
    if type(value) is not str or not value:
        raise EndpointConfigError(f"{what} must be a non-empty str or env(...), got {value!r}")


def resolve(value: Text | None, what: str) -> str | None:
    """``value`` as text: an :class:`Env` read now, a str as it is."""
    return value.read(what) if isinstance(value, Env) else value


@dataclass(frozen=True)
class Store:
    """An aggregate store on a registered database adapter (``docoutbox.stores``:
    ``"mongo"``, ``"cosmos"`` or a third party's); the values as
    :class:`~docoutbox.ports.kit.StoreSettings`."""

    adapter: str
    url: Text = field(repr=False)
    database: str
    collection: str
    key: Text | None = field(default=None, repr=False)
    timeout: float | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _text(self.adapter, "Store.adapter")
        _text(self.url, "Store.url")
        _text(self.database, "Store.database")
        _text(self.collection, "Store.collection")
        _text(self.key, "Store.key", optional=True)

    def settings(self, endpoint: str) -> StoreSettings:
        what = f"endpoint {endpoint!r} store"
        url = resolve(self.url, f"{what} url")
        assert url is not None
        return StoreSettings(
            url,
            self.database,
            self.collection,
            key=resolve(self.key, f"{what} key"),
            timeout=self.timeout,
            options=dict(self.options),
        )


@dataclass(frozen=True)
class Broker:
    """The outbox's output on a registered broker adapter (``docoutbox.brokers``:
    ``"rabbitmq"``, ``"kafka"``); the values as :class:`~docoutbox.ports.kit.BrokerSettings`."""

    adapter: str
    url: Text = field(repr=False)
    destination: str | None = None
    routing_key: str | None = None
    declare: str | None = None
    timeout: float = 5.0
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _text(self.adapter, "Broker.adapter")
        _text(self.url, "Broker.url")

    def settings(self, endpoint: str) -> BrokerSettings:
        url = resolve(self.url, f"endpoint {endpoint!r} output url")
        assert url is not None
        return BrokerSettings(
            url,
            destination=self.destination,
            routing_key=self.routing_key,
            declare=self.declare,
            timeout=self.timeout,
            options=dict(self.options),
        )


Route = Callable[[Message], AggregateId]


def payload_field(name: str) -> Route:
    """A route reading the aggregate ID from the payload's field ``name``."""

    def route(message: Message) -> AggregateId:
        value = message.payload.get(name)
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise InvalidConfig(
                f"message {message.id} ({message.type}) has no {name!r} field naming its aggregate"
            )
        return value

    route.__name__ = f"payload_field({name!r})"
    return route


@dataclass(frozen=True)
class _Input:
    #: The aggregate a message goes to.
    route: Route
    #: The message types that may create their aggregate.
    creates: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        if not callable(self.route):
            raise EndpointConfigError(f"an input's route must be callable, got {self.route!r}")
        object.__setattr__(self, "creates", creating_types(self.creates))

    @property
    def label(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class RabbitQueue(_Input):
    """Consume the RabbitMQ queue ``queue`` (which must exist) with
    :class:`~docoutbox_rabbitmq.aio.AsyncRabbitConsumer`."""

    queue: str
    url: Text = field(default=DEFAULT_RABBITMQ_URL, repr=False)
    prefetch: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        _text(self.queue, "RabbitQueue.queue")
        _text(self.url, "RabbitQueue.url")
        if type(self.prefetch) is not int or not 1 <= self.prefetch <= 65535:
            raise EndpointConfigError(f"prefetch must be 1 to 65535, got {self.prefetch!r}")

    @property
    def label(self) -> str:
        return f"rabbitmq:{self.queue}"


@dataclass(frozen=True, kw_only=True)
class KafkaTopic(_Input):
    """Consume Kafka ``topics`` in consumer group ``group`` with
    :class:`~docoutbox_kafka.aio.AsyncKafkaConsumer`; rejects go to the store's dead
    letters (and to ``dead_letter_topic`` if given)."""

    topics: Sequence[str]
    group: str
    config: Text | Mapping[str, str] = field(default="127.0.0.1:9092", repr=False)
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        topics = [self.topics] if isinstance(self.topics, str) else list(self.topics)
        if not topics:
            raise EndpointConfigError("KafkaTopic needs at least one topic")
        for topic in topics:
            _text(topic, "KafkaTopic.topics")
        object.__setattr__(self, "topics", tuple(topics))
        _text(self.group, "KafkaTopic.group")

    @property
    def label(self) -> str:
        return f"kafka:{','.join(self.topics)}"


Input = RabbitQueue | KafkaTopic
#: The outbox's output: a broker declaration, or a publisher object (sync or async).
Output = Broker | Publisher | AsyncPublisher
#: The store: a declaration, or an async kit already opened.
StoreSpec = Store | AsyncStoreKit


class Endpoint(Generic[S]):
    """One unit that receives, handles exactly once and sends.

    >>> orders = Endpoint(
    ...     "orders", Order, handlers,
    ...     store=Store("mongo", env("MONGODB_URI"), "shop", "orders"),
    ...     inputs=[RabbitQueue(queue="orders", route=payload_field("order_id"),
    ...                         creates={"PlaceOrder"})],
    ...     output=Broker("rabbitmq", env("RABBITMQ_URL"), destination="shop"),
    ... )

    Run it with ``docoutbox run module:orders`` (or :func:`docoutbox_app.endpoint.serve`);
    test it in memory with :class:`docoutbox_app.testing.TestBus`. In one process it runs
    its consumers (one per input, acknowledging after the commit), the leased dispatcher
    of its own collection (:func:`~docoutbox_app.wiring.build_async_dispatcher`, named
    after the endpoint), and reports to the process's health and metrics endpoint.

    - ``handlers``: a :class:`~docoutbox.Handlers` (or any handler function); every type
      in an input's ``creates`` must have a handler in it;
    - ``config``: the store's :class:`~docoutbox.StoreConfig`; ``dispatch``: the
      dispatcher's :class:`~docoutbox_app.wiring.DispatchOptions` (its ``name`` is the
      endpoint's); ``retry``: the consumers' handler retries.
    """

    def __init__(
        self,
        name: str,
        aggregate: type[S],
        handlers: Handler[S],
        *,
        store: StoreSpec,
        inputs: Iterable[Input],
        output: Output,
        config: StoreConfig | None = None,
        dispatch: DispatchOptions | None = None,
        retry: HandlerRetry | None = None,
    ) -> None:
        if type(name) is not str or not name or not name.replace("-", "_").isidentifier():
            raise EndpointConfigError(
                f"an endpoint's name is letters, digits, '_' or '-', got {name!r}"
            )
        where = f"endpoint {name!r}"
        if not (isinstance(aggregate, type) and issubclass(aggregate, BaseModel)):
            raise EndpointConfigError(f"{where}: aggregate must be a pydantic model class")
        if not callable(handlers):
            raise EndpointConfigError(f"{where}: handlers must be a Handlers or a function")
        if not isinstance(store, Store | AsyncStoreKit):
            raise EndpointConfigError(
                f"{where}: store must be a Store(...) or an AsyncStoreKit, "
                f"got {type(store).__name__}"
            )
        listed = list(inputs) if isinstance(inputs, Iterable) else None
        if not listed:
            raise EndpointConfigError(f"{where}: needs at least one input")
        seen: set[str] = set()
        for item in listed:
            if not isinstance(item, RabbitQueue | KafkaTopic):
                raise EndpointConfigError(
                    f"{where}: an input is a RabbitQueue or a KafkaTopic, got {item!r}"
                )
            if item.label in seen:
                raise EndpointConfigError(f"{where}: {item.label} is an input twice")
            seen.add(item.label)
            if isinstance(handlers, Handlers):
                missing = sorted(set(item.creates) - handlers.types)
                if missing:
                    raise EndpointConfigError(
                        f"{where}: {item.label} lets {', '.join(missing)} create an "
                        "aggregate, but no handler handles it"
                    )
        if not isinstance(output, Broker) and not callable(getattr(output, "publish", None)):
            raise EndpointConfigError(
                f"{where}: output must be a Broker(...) or a publisher, got {type(output).__name__}"
            )
        if config is not None and not isinstance(config, StoreConfig):
            raise EndpointConfigError(f"{where}: config must be a StoreConfig")
        if dispatch is not None and not isinstance(dispatch, DispatchOptions):
            raise EndpointConfigError(f"{where}: dispatch must be DispatchOptions")
        if retry is not None and not isinstance(retry, HandlerRetry):
            raise EndpointConfigError(f"{where}: retry must be a HandlerRetry")
        self.name = name
        self.aggregate = aggregate
        self.handlers = handlers
        self.store = store
        self.inputs: tuple[Input, ...] = tuple(listed)
        self.output = output
        self.config = config or StoreConfig()
        options = dispatch or DispatchOptions()
        # The dispatcher decodes what the store encodes, unless told otherwise.
        self.dispatch = DispatchOptions(
            **{
                **options.__dict__,
                "name": name,
                "codec": options.codec or self.config.codec,
                "upcasters": options.upcasters or self.config.upcasters,
            }
        )
        self.retry = retry or HandlerRetry()

    def __repr__(self) -> str:
        inputs = ", ".join(item.label for item in self.inputs)
        return f"<Endpoint {self.name} {self.aggregate.__name__} inputs=[{inputs}]>"

    def settings(self) -> Settings:
        """The endpoint's settings with every :class:`Env` read; EndpointConfigError for a
        variable that is not set."""
        store = self.store.settings(self.name) if isinstance(self.store, Store) else None
        output = self.output.settings(self.name) if isinstance(self.output, Broker) else None
        urls: dict[str, str] = {}
        for item in self.inputs:
            what = f"endpoint {self.name!r} input {item.label}"
            if isinstance(item, RabbitQueue):
                url = resolve(item.url, what)
            elif isinstance(item.config, Mapping):
                url = None
            else:
                url = resolve(item.config, what)
            if url is not None:
                urls[item.label] = url
        return Settings(store, output, urls)


@dataclass(frozen=True)
class Settings:
    """An endpoint's settings as read at start (secrets included: never print them)."""

    store: StoreSettings | None = field(repr=False)
    output: BrokerSettings | None = field(repr=False)
    #: The URL (or Kafka servers) of each input, by its label.
    inputs: Mapping[str, str] = field(repr=False)

    def secrets(self) -> list[str]:
        """Every credential in these settings, to be masked in logs and errors."""
        found: list[str] = []
        if self.store is not None:
            found += secrets_of(self.store.url)
            if self.store.key:
                found.append(self.store.key)
        if self.output is not None:
            found += secrets_of(self.output.url)
        for url in self.inputs.values():
            found += secrets_of(url)
        return found
