"""Every port an adapter implements, sync and async.

- :mod:`~docoutbox.ports.store`: store backends (load, insert, write, find pending);
- :mod:`~docoutbox.ports.dispatch`: publishers, dead letters, change sources, checkpoints,
  lease tables and ownership.
"""
