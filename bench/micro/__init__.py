"""pytest-benchmark micro-benchmarks of millstream's Python layer.

Not part of the test suite (``pytest`` from the repository root collects ``tests/`` only).
Run::

    .venv/bin/python -m pytest bench/micro -p no:cacheprovider --benchmark-only

Add ``--benchmark-json bench/results/micro.json`` to keep the raw figures.
"""
