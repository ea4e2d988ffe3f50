"""Operator tools over any store, used by the operator commands.

- :mod:`~docoutbox.dispatch.tools.replay`: dead letters listed, shown, replayed, purged;
- :mod:`~docoutbox.dispatch.tools.failures`: dead letters by failure group (fingerprints);
- :mod:`~docoutbox.dispatch.tools.lease_rows`: who holds which partition.
"""
