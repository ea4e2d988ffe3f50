"""The application ring: the only code that names concrete adapters.

Imports point inward: this package imports the core (``docoutbox``) and the adapters;
nothing imports it.

- :mod:`docoutbox_app.wiring`: the composition root (:func:`build_dispatcher`,
  :func:`build_async_dispatcher`, :class:`DispatchOptions`);
- :mod:`docoutbox_app.registry`: the store and broker adapters installed, by their entry
  points (``docoutbox.stores``, ``docoutbox.brokers``);
- :mod:`docoutbox_app.cli`: the ``docoutbox`` command and its operator commands.
"""

from docoutbox_app.registry import AdapterMissing
from docoutbox_app.wiring import DispatchOptions, build_async_dispatcher, build_dispatcher

__all__ = ["AdapterMissing", "DispatchOptions", "build_async_dispatcher", "build_dispatcher"]
