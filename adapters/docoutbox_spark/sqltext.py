"""SQL text for the audit's expressions.

Rule: the audit builds its expressions as SQL text, one projection per frame
(``selectExpr``), instead of as Column objects: every Column a driver builds is a call
into the JVM, and an audit of a small collection spends most of its time building its
query that way. Only literals made here go into that text, quoted by :func:`literal`;
column names by :func:`name`.
"""

from __future__ import annotations


def literal(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def name(column: str) -> str:
    """A column's name as a SQL identifier."""
    return "`" + column.replace("`", "``") + "`"


def when(condition: str, value: str) -> str:
    """``value`` when ``condition`` holds, else null."""
    return f"CASE WHEN {condition} THEN {value} END"


def empty(ddl: str) -> str:
    """An empty array of ``ddl`` elements."""
    return f"CAST(array() AS array<{ddl}>)"


def aliased(parts: list[tuple[str, str]]) -> list[str]:
    """``(name, expression)`` pairs as the arguments of ``selectExpr``."""
    return [f"{value} AS {name(column)}" for column, value in parts]
