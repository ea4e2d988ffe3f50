"""Argument types shared by the ``docoutbox`` commands, and their parser.

Rule: a value the command cannot use is refused by argparse (exit 2, one line naming the
option), before any server is contacted; nothing reaches a driver that would fail on it
with a traceback or a misleading "cannot connect" (exit 1). The line is all that is
printed (:class:`Parser`): no usage dump before it; ``--help`` shows the usage.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, NoReturn

from docoutbox.retry import MAX_COUNT
from docoutbox.retry import MAX_SECONDS as MAX_INTERVAL
from docoutbox.store.core import MAX_PARTITIONS

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
    """Why ``text`` cannot name a ``what`` ("database" or "collection") of ``store``
    ("mongo" or "cosmos"; None: not known yet, only an empty name or a NUL character is
    refused), or None."""
    if store == "cosmos":
        # Cosmos DB resource IDs: 1-255 characters, none of / \\ # ?, no trailing space.
        forbidden = "/\\#?"
        reserved = len(text) > 255 or text.endswith(" ")
    elif store == "mongo":
        forbidden = '/\\. "$' if what == "database" else "$"
        reserved = text.startswith("system.")
    else:
        forbidden, reserved = "", False
    bad = [c for c in forbidden if c in text]
    if not text or "\x00" in text or bad or reserved:
        return f"not a usable {what} name: {text!r}" + (
            f" (it must not contain {''.join(bad)!r})" if bad else ""
        )
    return None


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
    """What is wrong with ``--mongo-uri`` and the Cosmos DB options together, or None."""
    if args.cosmos_endpoint and args.mongo_uri:
        return "give either --mongo-uri or --cosmos-endpoint, not both"
    if args.cosmos_endpoint and not args.cosmos_key:
        return "--cosmos-endpoint needs --cosmos-key (or COSMOS_KEY)"
    if not args.mongo_uri and not args.cosmos_endpoint:
        return "--mongo-uri (or DOCOUTBOX_MONGO_URI) is required, or --cosmos-endpoint"
    if (args.cosmos_ca_file or args.cosmos_insecure) and not args.cosmos_endpoint:
        return "--cosmos-ca-file and --cosmos-insecure apply to --cosmos-endpoint only"
    if args.cosmos_ca_file and args.cosmos_insecure:
        return "give either --cosmos-ca-file or --cosmos-insecure, not both"
    if args.cosmos_ca_file and not os.path.isfile(args.cosmos_ca_file):
        return f"--cosmos-ca-file: no such file: {args.cosmos_ca_file}"
    return None


#: Each store's name in messages, and the extra that installs its adapter.
STORES = {"mongo": ("MongoDB", "mongodb"), "cosmos": ("Cosmos DB", "cosmos")}


def store_of(args: argparse.Namespace) -> str:
    """The store the connection options name: "cosmos" or "mongo"."""
    return "cosmos" if args.cosmos_endpoint else "mongo"


def adapter_missing(store: str, exc: ImportError) -> str:
    """The error line for a store whose adapter cannot be imported."""
    label, extra = STORES[store]
    return f"the {label} adapter is not installed ({exc}); pip install 'docoutbox[{extra}]'"
