"""Every port an adapter implements, sync and async.

- :mod:`~docoutbox.ports.store`: store backends (load, insert, write, find pending) and
  the optional batch writer;
- :mod:`~docoutbox.ports.dispatch`: publishers, dead letters, change sources, checkpoints,
  lease tables and ownership, with their optional capabilities;
- :mod:`~docoutbox.ports.archive`: the inbox archive a spilling inbox keeps its old IDs
  in (an optional capability of a store backend);
- :mod:`~docoutbox.ports.codec`: a step of the encoding of stored values (compression,
  encryption);
- :mod:`~docoutbox.ports.payloads`: payload stores of the claim check, and the optional
  kit capability that opens one;
- :mod:`~docoutbox.ports.kit`: kits (every port of one database, from plain settings) and
  the store and broker adapters the entry points name.
"""
