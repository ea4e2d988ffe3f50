"""The dispatcher: committed outbox entries become confirmed publishes, then are trimmed.

- :mod:`~docoutbox.dispatch.engine`: the pure engine (the loop, flows, scheduler,
  checkpoints, lease planning);
- :mod:`~docoutbox.dispatch.drivers`: the threaded and asyncio drivers, and ownership;
- :mod:`~docoutbox.dispatch.extras`: optional delivery modes the engine never imports;
- :mod:`~docoutbox.dispatch.tools`: operator tools (dead-letter replay, lease rows).
"""
