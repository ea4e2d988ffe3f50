"""Upcasters: functions that turn an old stored value into the current model, on read.

Rule: a stored state carries the version of its aggregate's model (the document's
``state_version``) and an outbox entry the version of its payload (the entry's
``payload_version``); no field means version 1. A function registered for
``(type, n)`` turns a version-``n`` value into a version-``n + 1`` one, so a type's
current version is one more than the highest ``n`` registered for it, and a value is
read by applying every step from its version up. Writes stamp the current version, and
only for types with upcasters, so documents of other types stay as they were.

A value of a version below the first registered step, or above the current one (written
by newer code), is refused with :class:`~docoutbox.errors.MalformedDocument`; an
upcaster that returns something other than a dict too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from docoutbox.errors import InvalidConfig, MalformedDocument

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
#: The stored field holding a document's state version.
STATE_VERSION = "state_version"
#: The stored field holding an outbox entry's payload version.
PAYLOAD_VERSION = "payload_version"


class _Chain:
    """The steps of one kind (states or payloads), by type then from-version."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.steps: dict[str, dict[int, Upcaster]] = {}

    def add(self, type_name: str, version: int, function: Upcaster) -> None:
        if not isinstance(type_name, str) or not type_name:
            raise InvalidConfig(f"an upcaster's type must be a non-empty str: {type_name!r}")
        if type(version) is not int or version < 1:
            raise InvalidConfig(f"an upcaster's version must be an int >= 1, got {version!r}")
        if not callable(function):
            raise InvalidConfig(f"an upcaster must be callable, got {function!r}")
        steps = self.steps.setdefault(type_name, {})
        if version in steps:
            raise InvalidConfig(f"two {self.kind} upcasters for ({type_name!r}, {version})")
        steps[version] = function

    def current(self, type_name: str) -> int | None:
        """The current version of ``type_name``; None when it has no upcasters."""
        steps = self.steps.get(type_name)
        return None if not steps else max(steps) + 1

    def upcast(self, type_name: str, version: object, value: dict[str, Any]) -> dict[str, Any]:
        steps = self.steps.get(type_name)
        if not steps:
            return value
        stored = 1 if version is None else version
        if not isinstance(value, dict):
            raise MalformedDocument(f"a {type_name} {self.kind} is not an object: {value!r:.60}")
        current = max(steps) + 1
        if type(stored) is not int or stored > current:
            raise MalformedDocument(
                f"a {type_name} {self.kind} of version {stored!r}: this reader's current "
                f"version is {current} (was it written by newer code?)"
            )
        if stored < current:
            value = copy.deepcopy(value)  # the stored copy may be cached: never change it
        for step in range(stored, current):
            function = steps.get(step)
            if function is None:
                raise MalformedDocument(
                    f"a {type_name} {self.kind} of version {step} has no upcaster to "
                    f"version {step + 1}"
                )
            value = function(value)
            if not isinstance(value, dict):
                raise MalformedDocument(
                    f"the {self.kind} upcaster ({type_name!r}, {step}) returned "
                    f"{type(value).__name__}, not a dict"
                )
        return value


class Upcasters:
    """The upcasters of a service's aggregates and messages.

    >>> upcasters = Upcasters()
    >>> @upcasters.state("Account", 1)
    ... def split_name(old):
    ...     first, _, last = old.pop("name").partition(" ")
    ...     return {**old, "first": first, "last": last}

    Each function takes the stored value as a dict (already decoded, if a codec encoded
    it) and returns it as the next version's dict; it may change what it is given.
    """

    def __init__(self) -> None:
        self._states = _Chain("state")
        self._payloads = _Chain("payload")

    def state(self, aggregate_type: str, version: int) -> Callable[[Upcaster], Upcaster]:
        """Register (as a decorator) the step from ``version`` of ``aggregate_type``'s
        state (its documents' ``type``) to the next."""

        def register(function: Upcaster) -> Upcaster:
            self._states.add(aggregate_type, version, function)
            return function

        return register

    def payload(self, message_type: str, version: int) -> Callable[[Upcaster], Upcaster]:
        """Register (as a decorator) the step from ``version`` of the payload of outbox
        entries of type ``message_type`` to the next."""

        def register(function: Upcaster) -> Upcaster:
            self._payloads.add(message_type, version, function)
            return function

        return register

    def state_version(self, aggregate_type: str) -> int | None:
        """The version written with ``aggregate_type``'s state (None: not versioned)."""
        return self._states.current(aggregate_type)

    def payload_version(self, message_type: str) -> int | None:
        """The version written with ``message_type``'s payloads (None: not versioned)."""
        return self._payloads.current(message_type)

    def upcast_state(
        self, aggregate_type: str, version: object, state: dict[str, Any]
    ) -> dict[str, Any]:
        """``state``, stored at ``version`` (None: 1), as the current version."""
        return self._states.upcast(aggregate_type, version, state)

    def upcast_payload(
        self, message_type: str, version: object, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """``payload``, stored at ``version`` (None: 1), as the current version."""
        return self._payloads.upcast(message_type, version, payload)
