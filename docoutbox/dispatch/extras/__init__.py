"""Optional delivery modes. The engine never imports them.

- :mod:`~docoutbox.dispatch.extras.immediate`: publish a commit's entries right after it;
- :mod:`~docoutbox.dispatch.extras.claims`: the immediate path and the dispatcher, in one
  process, publish each entry once between them;
- :mod:`~docoutbox.dispatch.extras.settled`: publishers that leave young entries to the
  immediate path of another process;
- :mod:`~docoutbox.dispatch.extras.local`: broker-less delivery to aggregates in the same
  database.
"""
