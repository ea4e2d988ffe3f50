"""A griffe extension for the API reference: Sphinx roles in docstrings as inline code.

Rule: the docstrings are written for ``help()`` and Sphinx-style readers
(``:class:`~docoutbox.errors.NotFound```); the site shows each role as the code it
names (``NotFound``, or the full dotted name without ``~``), never the raw role markup.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|py:\w+):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by inline code."""

    def code(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
