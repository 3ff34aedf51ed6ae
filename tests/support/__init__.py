"""What the tests share, in one importable place: jobs, fixtures, brokers, clusters and the
protocol simulation. Tests import it one way, ``from tests.support.<module> import ...``
(the repository root is on ``sys.path``: ``pythonpath`` in ``pyproject.toml``); no test
module imports another."""
