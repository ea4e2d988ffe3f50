"""Argument types shared by the ``docoutbox`` commands, and their parser.

Rule: a value the command cannot use is refused by argparse (exit 2, one line naming the
option), before any server is contacted; nothing reaches a driver that would fail on it
with a traceback or a misleading "cannot connect" (exit 1). The line is all that is
printed (:class:`Parser`): no usage dump before it; ``--help`` shows the usage.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
from typing import Any, NoReturn

from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import name_problem as kit_name_problem
from docoutbox.retry import MAX_COUNT
from docoutbox.retry import MAX_SECONDS as MAX_INTERVAL
from docoutbox.store.core import MAX_PARTITIONS
from docoutbox.stored import Codec, StoredValues, Upcasters
from docoutbox_app import registry
from docoutbox_app.registry import AdapterMissing

#: The longest timeout, in seconds, a command accepts (a day; intervals may be as long as
#: the Python API allows, MAX_INTERVAL). pymongo refuses timeouts of a billion
#: milliseconds or more, ``timedelta`` overflows far beyond: a larger value is a typo.
MAX_TIMEOUT = 86_400.0


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, ``<prog>: error: <message>
    (see <prog> --help)``, and exit 2: the usage it would print first (30 lines for
    ``docoutbox dispatch``) hid the one line that mattered. Its subparsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def number(
    kind: type[int] | type[float],
    low: float,
    *,
    strict: bool = False,
    high: float | None = None,
) -> Any:
    """An argparse ``type``: a finite number of ``kind`` >= ``low`` (> ``low`` if strict),
    and at most ``high``."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            relation = "greater than" if strict else "at least"
            raise argparse.ArgumentTypeError(f"must be a finite number {relation} {low}: {text}")
        if high is not None and value > high:
            shown = int(high) if float(high).is_integer() else high
            raise argparse.ArgumentTypeError(f"must be at most {shown}: {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def name_problem(text: str, what: str, store: str | None = "mongo") -> str | None:
    """Why ``text`` cannot name a ``what`` ("database" or "collection") of ``store`` (an
    adapter name, by its own rules; None: not known yet, or an adapter that cannot be
    loaded: only an empty name or a NUL character is refused), or None."""
    if store is not None:
        try:
            adapter = registry.store(store)
        except AdapterMissing:
            pass  # reported when the command connects
        else:
            return adapter.name_problem(text, what)
    return kit_name_problem(text, what)


def names_problem(args: argparse.Namespace, store: str, names: dict[str, str]) -> str | None:
    """The first of ``names`` (argument -> "database" or "collection") given a value
    ``store`` cannot use, as an error line naming its option; None if all can be used."""
    for option, what in names.items():
        text = getattr(args, option, None)
        problem = None if text is None else name_problem(text, what, store)
        if problem is not None:
            return f"--{option.replace('_', '-')}: {problem}"
    return None


def name(what: str, store: str | None = "mongo") -> Any:
    """An argparse ``type`` for a database or collection name of ``store`` (None: the
    store is not known yet; the command checks the rest with :func:`name_problem`)."""

    def parse(text: str) -> str:
        problem = name_problem(text, what, store)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    parse.__name__ = f"{what} name"
    return parse


#: A TCP port to serve on (0: any free port).
PORT = number(int, 0, high=65535)
POSITIVE = number(float, 0, strict=True)
NON_NEGATIVE = number(float, 0)
AT_LEAST_ONE = number(int, 1, high=MAX_COUNT)
#: Seconds between two runs of something (sweeps, checkpoints, progress lines).
INTERVAL = number(float, 0, strict=True, high=MAX_INTERVAL)
#: Seconds of grace (0 allowed).
GRACE = number(float, 0, high=MAX_INTERVAL)
#: Seconds to wait for a server or a broker.
TIMEOUT = number(float, 0, strict=True, high=MAX_TIMEOUT)
SERVER_TIMEOUT_HELP = (
    "seconds to reach the server (default: the MongoDB URI's serverSelectionTimeoutMS "
    "and connectTimeoutMS, else 5)"
)
#: The stores' ``StoreConfig.partitions``: the same bounds.
PARTITIONS = number(int, 1, high=MAX_PARTITIONS)
#: A ``--limit`` (0: no limit); a server counts in 64-bit integers.
LIMIT = number(int, 0, high=2**63 - 1)
DATABASE = name("database")
COLLECTION = name("collection")
#: For commands that take MongoDB or Cosmos DB: checked with :func:`name_problem` once the
#: store is known.
ANY_DATABASE = name("database", None)
ANY_COLLECTION = name("collection", None)


def add_cosmos_options(parser: argparse.ArgumentParser) -> None:
    """``--cosmos-endpoint``, ``--cosmos-key``, ``--cosmos-ca-file`` and
    ``--cosmos-insecure``, each defaulting to its environment variable."""
    env = os.environ.get
    parser.add_argument(
        "--cosmos-endpoint",
        default=env("COSMOS_ENDPOINT"),
        help="Cosmos DB account endpoint (or COSMOS_ENDPOINT), instead of --mongo-uri",
    )
    parser.add_argument(
        "--cosmos-key",
        default=env("COSMOS_KEY"),
        help="Cosmos DB account key (or COSMOS_KEY, which keeps it out of the process list)",
    )
    parser.add_argument(
        "--cosmos-ca-file",
        metavar="PEM",
        default=env("COSMOS_CA_FILE"),
        help="trust the certificate(s) in this PEM file for an https Cosmos DB endpoint with a "
        "self-signed or private-CA certificate, such as the emulator's (or COSMOS_CA_FILE)",
    )
    parser.add_argument(
        "--cosmos-insecure",
        action="store_true",
        help="do NOT verify the Cosmos DB endpoint's certificate (local emulators only: the "
        "key and the data can be read by anyone on the path); prefer --cosmos-ca-file",
    )


def connection_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the store options together (``--mongo-uri``, the Cosmos DB
    options, ``--store``/``--store-url``), or None."""
    store = getattr(args, "store", None)
    if store not in (None, "mongo", "cosmos"):
        if not getattr(args, "store_url", None):
            return f"--store {store} needs --store-url (or DOCOUTBOX_STORE_URL)"
        if args.cosmos_endpoint:
            return f"--cosmos-endpoint applies to Cosmos DB, not --store {store}"
        return None
    if store == "cosmos" and not args.cosmos_endpoint:
        return "--store cosmos needs --cosmos-endpoint (or COSMOS_ENDPOINT)"
    if args.cosmos_endpoint and args.mongo_uri:
        return "give either --mongo-uri or --cosmos-endpoint, not both"
    if args.cosmos_endpoint and not args.cosmos_key:
        return "--cosmos-endpoint needs --cosmos-key (or COSMOS_KEY)"
    if not args.mongo_uri and not args.cosmos_endpoint and not getattr(args, "store_url", None):
        return "--mongo-uri (or DOCOUTBOX_MONGO_URI) is required, or --cosmos-endpoint"
    if (args.cosmos_ca_file or args.cosmos_insecure) and not args.cosmos_endpoint:
        return "--cosmos-ca-file and --cosmos-insecure apply to --cosmos-endpoint only"
    if args.cosmos_ca_file and args.cosmos_insecure:
        return "give either --cosmos-ca-file or --cosmos-insecure, not both"
    if args.cosmos_ca_file and not os.path.isfile(args.cosmos_ca_file):
        return f"--cosmos-ca-file: no such file: {args.cosmos_ca_file}"
    return None


def store_of(args: argparse.Namespace) -> str:
    """The store adapter the options name: ``--store``, else "cosmos" for
    ``--cosmos-endpoint``, else "mongo"."""
    store = getattr(args, "store", None)
    if store:
        return str(store)
    return "cosmos" if args.cosmos_endpoint else "mongo"


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type`` for ``KEY=VALUE`` (an adapter option)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


class KeyValues(argparse.Action):
    """Collects repeated ``KEY=VALUE`` options into one dict."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        options = dict(getattr(namespace, self.dest, None) or {})
        key, value = values
        options[key] = value
        setattr(namespace, self.dest, options)


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """``--store``, ``--store-url`` and ``--store-option``: any database adapter
    registered in the ``docoutbox.stores`` entry point group."""
    env = os.environ.get
    parser.add_argument(
        "--store",
        metavar="NAME",
        default=env("DOCOUTBOX_STORE"),
        help="the database adapter, by its registered name (installed: "
        f"{', '.join(registry.names(registry.STORES)) or 'none'}); default: cosmos with "
        "--cosmos-endpoint, else mongo",
    )
    parser.add_argument(
        "--store-url",
        default=env("DOCOUTBOX_STORE_URL"),
        help="the adapter's address, for adapters other than mongo and cosmos (or "
        "DOCOUTBOX_STORE_URL; a secret goes in DOCOUTBOX_STORE_KEY)",
    )
    parser.add_argument(
        "--store-option",
        metavar="KEY=VALUE",
        type=key_value,
        action=KeyValues,
        help="a setting of the adapter's own (repeatable)",
    )


def adapter_missing(store: str, exc: ImportError) -> str:
    """The error line for a store whose adapter cannot be imported."""
    label, extra = STORES.get(store, (store, store))
    return f"the {label} adapter is not installed ({exc}); pip install 'docoutbox[{extra}]'"


#: Each built-in store's name in messages, and the extra that installs its adapter.
STORES = {"mongo": ("MongoDB", "mongodb"), "cosmos": ("Cosmos DB", "cosmos")}


def stored_values(target: str) -> StoredValues:
    """The :class:`~docoutbox.stored.StoredValues` ``target`` (``module:name``) names, from a
    ``StoredValues``, a ``Codec`` or an ``Upcasters``; InvalidConfig saying what is wrong."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise InvalidConfig(f"--decode {target!r} is not module:name (for example shop.keys:codec)")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except ImportError as exc:
        raise InvalidConfig(f"--decode {target}: importing {module_name} failed: {exc}") from exc
    except AttributeError:
        raise InvalidConfig(f"--decode {target}: {module_name} has no {attribute!r}") from None
    if isinstance(value, StoredValues):
        return value
    if isinstance(value, Codec):
        return StoredValues(codec=value)
    if isinstance(value, Upcasters):
        return StoredValues(upcasters=value)
    raise InvalidConfig(
        f"--decode {target} is a {type(value).__name__}, not a StoredValues, Codec or Upcasters"
    )
