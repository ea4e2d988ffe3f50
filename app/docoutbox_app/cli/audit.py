"""``docoutbox audit`` and ``docoutbox export``: wiring only.

The commands live in :mod:`docoutbox_app.cli.spark`, imported when one of them runs, so
the CLI starts without pyspark.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

COMMANDS = ("audit", "export")


def register(sub: Any) -> None:
    """Show the commands in ``docoutbox --help`` (their own parser handles the options)."""
    sub.add_parser("audit", help="audit collections with Spark (docoutbox audit --help)")
    sub.add_parser("export", help="write a Parquet snapshot of collections for the audit")


def main(args: list[str]) -> int:
    try:
        command = importlib.import_module("docoutbox_app.cli.spark")
    except ImportError as exc:
        print(f"docoutbox: error: pip install 'docoutbox[spark]' ({exc})", file=sys.stderr)
        return 1
    code: int = command.main(args)
    return code


__all__ = ["COMMANDS", "main", "register"]
