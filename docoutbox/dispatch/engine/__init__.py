"""The pure dispatch engine: no threads, no asyncio, no I/O; time and randomness injected.

- :mod:`~docoutbox.dispatch.engine.loop`: the one dispatch loop (:class:`DispatchEngine`):
  sweeps, the stream, checkpoints and runs, as operations a driver performs;
- :mod:`~docoutbox.dispatch.engine.flow`: one aggregate's publish-then-trim flow;
- :mod:`~docoutbox.dispatch.engine.due`: which entries a run publishes now (scheduled
  entries, I4 among due entries);
- :mod:`~docoutbox.dispatch.engine.due_clock`: when to query for scheduled entries fallen due;
- :mod:`~docoutbox.dispatch.engine.scheduler`: which aggregate runs are due;
- :mod:`~docoutbox.dispatch.engine.batching`: how the runs begun are dealt to workers
  (packed under publish rounds, spread without);
- :mod:`~docoutbox.dispatch.engine.checkpoint`: how far the checkpoint may move (I5);
- :mod:`~docoutbox.dispatch.engine.leases`: pure lease planning (keep, give up, take);
- :mod:`~docoutbox.dispatch.engine.trimmed`: what was trimmed lately, so an older copy is
  not published again;
- :mod:`~docoutbox.dispatch.engine.deferred`: trims written behind the publishes,
  coalesced per aggregate, bounded in delay and count;
- :mod:`~docoutbox.dispatch.engine.backlog`: the pending backlog, measured;
- :mod:`~docoutbox.dispatch.engine.lag`: pending work per partition or feed range, and the
  scale decision taken from it;
- :mod:`~docoutbox.dispatch.engine.metrics`: the metrics hooks the engine calls.
"""
