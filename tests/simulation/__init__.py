"""A deterministic simulation that proves exactly-once processing under faults.

Seeded schedules run producers, a dispatcher, a broker and consumers as generators that
drive the library's own sans-IO flows step by step, against the in-memory store or the
MongoDB wire server, with faults injected between any two steps. See ``tests/README.md``
("Simulation") for how to run and replay them.
"""
