"""Drivers: how the engine's operations reach the ports, on threads or on asyncio.

- :mod:`~docoutbox.dispatch.drivers.operations`: each engine operation mapped onto the
  ports, sync and async, and the group commit of concurrent trims;
- :mod:`~docoutbox.dispatch.drivers.threads`: :class:`Dispatcher`, the threaded driver;
- :mod:`~docoutbox.dispatch.drivers.latches`: its stop and wake-up flags, which a signal
  handler may set;
- :mod:`~docoutbox.dispatch.drivers.aio`: :class:`AsyncDispatcher`, the asyncio driver;
- :mod:`~docoutbox.dispatch.drivers.ownership`: which partitions this instance may touch
  (a sole owner, or leases kept by a heartbeat).
"""
