"""The tests of the runnable examples in ``examples/``, one module per example."""
