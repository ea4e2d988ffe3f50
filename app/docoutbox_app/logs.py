"""Logging for the command line: ``key=value`` lines with every credential masked."""

from __future__ import annotations

import json
import logging
import re
import sys
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TextIO
from urllib.parse import unquote, urlsplit

#: ``scheme://user:password@`` in any text.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<secret>[^@\s/]*)@")
#: ``password=...`` style parameters (query strings, key=value pairs).
_PARAM = re.compile(r"(?i)(?P<head>\b[\w.]*(?:password|passwd|pwd|secret|token)=)[^&\s,;]+")

MASK = "***"
_HANDLER_NAME = "docoutbox-cli"


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URI passwords, ``password=`` values and the given secrets replaced."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _PARAM.sub(lambda m: f"{m['head']}{MASK}", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def secrets_of(uri: str | None) -> list[str]:
    """The password of ``uri`` (raw and percent-decoded), to be masked wherever it shows."""
    if not uri:
        return []
    try:
        password = urlsplit(uri).password
    except ValueError:
        return []
    if not password:
        return []
    return sorted({password, unquote(password)}, key=len, reverse=True)


class MaskingFilter(logging.Filter):
    """Masks credentials in every record's final message (arguments included)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text, self.secrets)
        record.msg, record.args = mask(message, self.secrets), None
        return True


_FIELD = re.compile(r"(\w+)=(\S+)")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``event`` (the message's
    first word), its ``key=value`` pairs as fields, and the whole ``message``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": message.split(" ", 1)[0] if message else "",
        }
        for key, value in _FIELD.findall(message):
            line.setdefault(key, value)
        line["message"] = message
        if record.exc_text or record.exc_info:
            line["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(line, default=str)


def configure(
    level: str | int = "INFO",
    *,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
    fmt: str = "text",
) -> logging.Handler:
    """Log ``ts level=... logger=... event key=value`` lines (or JSON objects, with
    ``fmt="json"``) to stderr, masked."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    )
    handler.addFilter(MaskingFilter(secrets))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    # The broker adapter turns pika's failures into one docoutbox error each; pika's own
    # per-attempt ERROR tracebacks (dozens a second while a broker refuses a login) are
    # only shown at DEBUG.
    debug = root.level <= logging.DEBUG
    logging.getLogger("pika").setLevel(logging.DEBUG if debug else logging.CRITICAL)
    logging.getLogger("pymongo").setLevel(logging.WARNING)
    logging.getLogger("azure").setLevel(logging.WARNING)  # every HTTP request at INFO
    return handler


def quiet_unverified_tls() -> None:
    """Stop urllib3's warning on every request to a server whose certificate is not
    checked (``--cosmos-insecure``, said once and loudly by the command instead).
    urllib3 comes with the ``cosmos`` extra only: without it there is nothing to quiet."""
    try:
        from urllib3.exceptions import InsecureRequestWarning  # noqa: PLC0415 - cosmos extra
    except ImportError:
        return
    warnings.filterwarnings("ignore", category=InsecureRequestWarning)
