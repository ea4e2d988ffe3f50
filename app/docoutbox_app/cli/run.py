"""``docoutbox run module:endpoint [module:endpoint ...]``: endpoints in one process.

Rule: everything that can be checked before connecting is checked first, and each
mistake ends the command with one ``docoutbox: error:`` line and exit code 2: a target
that is not ``module:attribute``, a module that cannot be imported, an attribute that is
not an :class:`~docoutbox_app.endpoint.Endpoint`, two endpoints with one name, an
environment variable that is not set, an adapter that is not installed, an unusable
database or collection name, a health port that cannot be bound. A server that cannot be
used at start or while running ends it with exit code 1. SIGTERM and SIGINT stop it
gracefully (exit 0). Secrets (from environment variables) are masked in every line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from docoutbox.errors import DocOutboxError, InvalidConfig
from docoutbox_app import logs, registry
from docoutbox_app.cli.help import Formatter
from docoutbox_app.endpoint.definition import Broker, Endpoint, Settings, Store
from docoutbox_app.endpoint.runtime import serve

log = logging.getLogger("docoutbox_app.cli.run")

EXAMPLE = "docoutbox run shop.orders:endpoint shop.inventory:endpoint --health-port 8080"


def add_command(sub: Any) -> None:
    """Register ``docoutbox run``."""
    r = sub.add_parser(
        "run",
        help="run endpoints: consume, handle exactly once, dispatch (docoutbox run --help)",
        formatter_class=Formatter,
        description=(
            "Run one or more endpoints in one process: each endpoint's consumers, the "
            "leased dispatcher of its collection, one health and metrics server. SIGTERM "
            "or SIGINT: stop consuming, finish the messages in hand and the publishes in "
            "flight, release the leases, exit 0."
        ),
        epilog=f"Example: {EXAMPLE}",
    )
    r.add_argument(
        "targets",
        nargs="+",
        metavar="module:endpoint",
        help="an Endpoint to run, as an importable module and the attribute holding it",
    )
    r.add_argument(
        "--health-port",
        type=_port,
        help="serve /healthz, /readyz, /health and /metrics on this port (0: any free one)",
    )
    r.add_argument("--health-host", default="127.0.0.1", help="address to serve them on")
    r.add_argument("--log-format", choices=["text", "json"], default="text", help="log lines")
    r.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    r.set_defaults(run=run)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def _fail(message: str, secrets: Sequence[str] = (), code: int = 2, limit: int = 400) -> int:
    line = " ".join(logs.mask(message, secrets).split())
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    print(f"docoutbox: error: {line}", file=sys.stderr)
    return code


def _load(target: str) -> Endpoint[Any]:
    """The endpoint ``target`` names; InvalidConfig saying what is wrong."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise InvalidConfig(f"{target!r} is not module:endpoint (for example shop.orders:orders)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise InvalidConfig(
                f"{target}: no module {exc.name!r} (run from the project's folder, or install it)"
            ) from exc
        raise InvalidConfig(f"{target}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise InvalidConfig(
            f"{target}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        value = getattr(module, attribute)
    except AttributeError:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Endpoint))
        known = f" (its endpoints: {', '.join(found)})" if found else " (it has no endpoint)"
        raise InvalidConfig(f"{target}: {module_name} has no {attribute!r}{known}") from None
    if not isinstance(value, Endpoint):
        raise InvalidConfig(f"{target} is a {type(value).__name__}, not an Endpoint")
    return value


def _check_adapters(endpoint: Endpoint[Any]) -> None:
    """The adapters ``endpoint`` names are installed, and its names usable by them."""
    if isinstance(endpoint.store, Store):
        adapter = registry.store(endpoint.store.adapter)
        for text, what in (
            (endpoint.store.database, "database"),
            (endpoint.store.collection, "collection"),
        ):
            problem = adapter.name_problem(text, what)
            if problem is not None:
                raise InvalidConfig(f"endpoint {endpoint.name!r}: {problem}")
    if isinstance(endpoint.output, Broker):
        registry.broker(endpoint.output.adapter)


def prepare(targets: Sequence[str]) -> tuple[list[Endpoint[Any]], list[Settings]]:
    """The endpoints and their settings, or InvalidConfig for the first mistake."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # run from a project's folder, as `python -m` does
    endpoints = [_load(target) for target in targets]
    names = [endpoint.name for endpoint in endpoints]
    for name in names:
        if names.count(name) > 1:
            raise InvalidConfig(f"two endpoints are named {name!r}: give each its own name")
    for endpoint in endpoints:
        _check_adapters(endpoint)
    return endpoints, [endpoint.settings() for endpoint in endpoints]


def run(args: argparse.Namespace) -> int:
    """``docoutbox run``: see the module's rule for exit codes."""
    # A signal while the endpoints' modules load or connect stops them as soon as they
    # run, rather than killing the process half-started.
    early = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: early.set())
    try:
        endpoints, settings = prepare(args.targets)
    except InvalidConfig as exc:
        return _fail(str(exc))
    secrets = [secret for each in settings for secret in each.secrets()]
    logs.configure(args.log_level, secrets=secrets, fmt=args.log_format)
    try:
        asyncio.run(_main(endpoints, settings, args, early))
    except OSError as exc:
        return _fail(f"cannot serve health on port {args.health_port}: {exc}", secrets)
    except InvalidConfig as exc:
        return _fail(str(exc), secrets)
    except DocOutboxError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", secrets, code=1)
    return 0


async def _main(
    endpoints: Sequence[Endpoint[Any]],
    settings: Sequence[Settings],
    args: argparse.Namespace,
    early: threading.Event,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _stopper(stop, signum))
    if early.is_set():
        log.info("signal_received before_start=%s stopping=%s", True, True)
        stop.set()
    await serve(
        endpoints,
        stop,
        settings=settings,
        health_port=args.health_port,
        health_host=args.health_host,
    )


def _stopper(stop: asyncio.Event, signum: int) -> Any:
    def handle() -> None:
        log.info("signal_received signal=%s stopping=%s", signal.Signals(signum).name, True)
        stop.set()

    return handle
