"""A state's stored form: pydantic's type check of the dump, paid only when it can fire.

Rule: a state is stored only if its dump carries every field with the field's own type.
``model_copy(update=...)`` and ``model_construct`` do not validate, and the read-back
alone lets ``"5"`` through an ``int`` field (stored as text), so the dump runs with
``warnings="error"``. pydantic-core takes longer to accept that argument than to dump a
small state, so for a model whose fields are all plain (``int``, ``float``, ``str``,
``bool``, each optionally ``None``; no serializer, no computed field, no extra fields)
the store checks each value's exact type itself and dumps without the check when every
one matches. The same pass checks what :func:`~docoutbox.model.storable_problem` would
(texts UTF-8, floats finite), so that walk is skipped too. Any other value, or any
other model, takes the checked path.
"""

from __future__ import annotations

from math import isfinite
from typing import Any

from pydantic import BaseModel

from docoutbox.model import is_utf8

#: A plain field: its name, its type, and whether it may hold None.
PlainField = tuple[str, Any, bool]

_PLAIN: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_FIELD_KEYS = frozenset({"type", "schema", "metadata", "validation_alias", "frozen"})


def plain_fields(model: type[BaseModel]) -> tuple[PlainField, ...] | None:
    """The fields of ``model`` if every one is plain (see the module), else None."""
    schema: Any = model.__pydantic_core_schema__
    if schema.get("type") != "model" or "serialization" in schema:
        return None
    if (schema.get("config") or {}).get("extra_fields_behavior") == "allow":
        return None
    inner = schema.get("schema") or {}
    if inner.get("type") != "model-fields" or inner.get("computed_fields"):
        return None
    if "extras_schema" in inner or "serialization" in inner:
        return None
    found: list[PlainField] = []
    for name, field in inner.get("fields", {}).items():
        if field.get("type") != "model-field" or not set(field) <= _FIELD_KEYS:
            return None
        kind = field["schema"]
        nullable = False
        while kind.get("type") in ("default", "nullable") and "serialization" not in kind:
            nullable = nullable or kind["type"] == "nullable"
            kind = kind["schema"]
        plain = _PLAIN.get(kind.get("type"))
        if plain is None or "serialization" in kind:
            return None
        found.append((name, plain, nullable))
    return tuple(found)


def exactly_typed(values: dict[str, Any], fields: tuple[PlainField, ...]) -> bool:
    """Whether ``values`` (a state's ``__dict__``) holds exactly the plain ``fields``,
    each with exactly its type (or None where allowed), every text UTF-8 and every float
    finite: then its dump cannot warn, and :func:`~docoutbox.model.storable_problem`
    has nothing to say about it. False sends the state down the checked path."""
    if len(values) != len(fields):  # a key that is no field (model_copy puts one there)
        return False
    for name, kind, nullable in fields:
        value: Any = values.get(name, values)  # missing: ``values`` is no field's type
        if type(value) is not kind:
            if nullable and value is None:
                continue
            return False
        if kind is str:
            if not value.isascii() and not is_utf8(value):
                return False
        elif kind is float and not isfinite(value):
            return False
    return True
