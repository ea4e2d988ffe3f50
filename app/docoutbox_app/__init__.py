"""The application ring: the only code that names concrete adapters.

Imports point inward: this package imports the core (``docoutbox``) and the adapters;
nothing imports it.

- :mod:`docoutbox_app.wiring`: the composition root (:func:`build_dispatcher`,
  :func:`build_async_dispatcher`, :class:`DispatchOptions`);
- :mod:`docoutbox_app.registry`: the store and broker adapters installed, by their entry
  points (``docoutbox.stores``, ``docoutbox.brokers``);
- :mod:`docoutbox_app.endpoint`: endpoints, one process that consumes, handles exactly
  once and dispatches (``docoutbox run``);
- :mod:`docoutbox_app.testing`: an endpoint in memory, for a service's own tests;
- :mod:`docoutbox_app.faststream`: a FastStream subscriber into a store, and a publisher
  through a FastStream broker (``docoutbox[faststream]``);
- :mod:`docoutbox_app.logs`: log set-up and masked secrets;
- :mod:`docoutbox_app.cli`: the ``docoutbox`` command and its operator commands.
"""

from docoutbox_app.registry import AdapterMissing
from docoutbox_app.wiring import DispatchOptions, build_async_dispatcher, build_dispatcher

__all__ = ["AdapterMissing", "DispatchOptions", "build_async_dispatcher", "build_dispatcher"]
