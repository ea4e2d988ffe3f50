"""Ratio benchmarks for docoutbox.

Every figure is measured against a baseline in the same run, on the same server, with
baseline and candidate rounds interleaved. Run everything with ``scripts/bench`` (or
``python -m benchmarks``); results are recorded in ``BENCHMARKS.md``.
"""
