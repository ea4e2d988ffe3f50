"""The aggregate store: one document per aggregate, its inbox and outbox, one conditional
write per message.

- :mod:`~docoutbox.store.document`: the stored layout and its reading;
- :mod:`~docoutbox.store.dump`: a state's stored form, type-checked only where it can fail;
- :mod:`~docoutbox.store.inbox`: de-duplication (ID window, exact watermarks);
- :mod:`~docoutbox.store.spill`: inbox spill-over (IDs move to an archive, not away);
- :mod:`~docoutbox.store.schedule`: scheduled entries, cancellation and the due-time hint;
- :mod:`~docoutbox.store.plans`: pure write plans and :func:`~docoutbox.store.plans.apply_plan`,
  the reference semantics;
- :mod:`~docoutbox.store.core`: the store's logic as sans-IO generator flows;
- :mod:`~docoutbox.store.batch`: many messages for one aggregate in one write;
- :mod:`~docoutbox.store.group`: group commit of concurrent handles in one process;
- :mod:`~docoutbox.store.observe`: the hooks tracing and metrics attach to;
- :mod:`~docoutbox.store.api`: :class:`AggregateStore` and :class:`AsyncAggregateStore`,
  thin drivers of those flows;
- :mod:`~docoutbox.ports.store`: what a store adapter provides.
"""
