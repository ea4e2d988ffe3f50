"""The dispatcher: committed outbox entries become confirmed publishes, then are trimmed.

- :mod:`~docoutbox.dispatch.ports`: what its adapters provide (publisher, dead letters,
  change source, checkpoints, lease table);
- :mod:`~docoutbox.dispatch.flow`: one aggregate's publish-then-trim flow (sans-IO);
- :mod:`~docoutbox.dispatch.checkpoint` and :mod:`~docoutbox.dispatch.stream`: where the
  stream stands and how far the checkpoint may move (I5);
- :mod:`~docoutbox.dispatch.leases` and :mod:`~docoutbox.dispatch.ownership`: which
  partitions an instance may touch;
- :mod:`~docoutbox.dispatch.scheduler`, :mod:`~docoutbox.dispatch.runner` and
  :mod:`~docoutbox.dispatch.dispatcher`: the threaded engine;
- :mod:`~docoutbox.dispatch.metrics`: metrics hooks.
"""
