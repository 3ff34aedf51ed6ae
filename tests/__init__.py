"""The test suite. A regular package, so that ``tests.support`` is this one whatever else
on ``sys.path`` is named ``tests`` (``bench/tests``, when a bench script runs by path)."""
