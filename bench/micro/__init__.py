"""pytest-benchmark micro-benchmarks of millstream's Python layer.

The test suite runs each of them once, unmeasured (``--benchmark-disable`` in the pytest
settings), so a benchmark that stops working fails CI. Measure with::

    .venv/bin/python -m pytest bench/micro -p no:cacheprovider --benchmark-only --benchmark-enable

Add ``--benchmark-json bench/results/micro.json`` to keep the raw figures.
"""
