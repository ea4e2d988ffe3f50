"""The adapters installed, found by their Python entry points.

Rule: a database adapter is a :class:`~docoutbox.ports.kit.StoreAdapter` named in the
entry point group ``docoutbox.stores``, a broker adapter a
:class:`~docoutbox.ports.kit.BrokerAdapter` in ``docoutbox.brokers``. docoutbox registers
its own there too (``mongo``, ``cosmos``; ``rabbitmq``, ``kafka``); a third-party package
adds its own by declaring, in its ``pyproject.toml``::

    [project.entry-points."docoutbox.stores"]
    mystore = "mypackage.kit:STORE"

Nothing else needs changing: ``docoutbox dispatch --store mystore ...`` finds it.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import BrokerAdapter, StoreAdapter

STORES = "docoutbox.stores"
BROKERS = "docoutbox.brokers"

#: The adapters docoutbox ships: their label in messages, and the extra that installs them.
_SHIPPED = {
    "mongo": ("MongoDB", "mongodb"),
    "cosmos": ("Cosmos DB", "cosmos"),
    "rabbitmq": ("RabbitMQ", "rabbitmq"),
    "kafka": ("Kafka", "kafka"),
}


class AdapterMissing(InvalidConfig):
    """An adapter that is not registered, or whose package cannot be imported."""


def _entry(group: str, name: str) -> EntryPoint:
    found = entry_points(group=group, name=name)
    if not found:
        known = ", ".join(names(group)) or "none"
        raise AdapterMissing(f"no adapter {name!r} in {group} (installed: {known})")
    return next(iter(found))


def names(group: str) -> list[str]:
    """The adapter names registered in ``group``, sorted."""
    return sorted({ep.name for ep in entry_points(group=group)})


def _load(group: str, name: str) -> object:
    entry = _entry(group, name)
    try:
        return entry.load()
    except ImportError as exc:
        # An adapter that cannot be imported cannot say its own label or extra.
        label, extra = _SHIPPED.get(name, (name, None))
        install = f"; pip install 'docoutbox[{extra}]'" if extra else ""
        raise AdapterMissing(f"the {label} adapter is not installed ({exc}){install}") from exc


def store(name: str) -> StoreAdapter:
    """The database adapter registered as ``name``, checked against the port."""
    adapter = _load(STORES, name)
    if not isinstance(adapter, StoreAdapter):
        raise AdapterMissing(
            f"the {STORES} entry point {name!r} is not a StoreAdapter "
            f"(needs label, extra, open, open_async, name_problem): {type(adapter).__name__}"
        )
    return adapter


def broker(name: str) -> BrokerAdapter:
    """The broker adapter registered as ``name``, checked against the port."""
    adapter = _load(BROKERS, name)
    if not isinstance(adapter, BrokerAdapter):
        raise AdapterMissing(
            f"the {BROKERS} entry point {name!r} is not a BrokerAdapter "
            f"(needs label, extra, publisher): {type(adapter).__name__}"
        )
    return adapter
