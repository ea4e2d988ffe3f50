"""The dispatcher: committed outbox entries become confirmed publishes, then are trimmed.

- :mod:`~docoutbox.dispatch.ports`: what its adapters provide (publisher, dead letters,
  change source, checkpoints, lease table);
- :mod:`~docoutbox.dispatch.flow`: one aggregate's publish-then-trim flow (sans-IO);
- :mod:`~docoutbox.dispatch.checkpoint`: where the stream stands and how far the
  checkpoint may move (I5);
- :mod:`~docoutbox.dispatch.leases` and :mod:`~docoutbox.dispatch.ownership`: which
  partitions an instance may touch;
- :mod:`~docoutbox.dispatch.engine`: the one dispatch loop, sans-IO (sweeps, stream,
  checkpoint, runs), with :mod:`~docoutbox.dispatch.scheduler` deciding which runs are
  due;
- :mod:`~docoutbox.dispatch.drivers`, :mod:`~docoutbox.dispatch.dispatcher` and
  :mod:`~docoutbox.dispatch.aio`: how operations reach the ports, the threaded driver and
  the asyncio driver;
- :mod:`~docoutbox.dispatch.metrics`: metrics hooks.
"""
