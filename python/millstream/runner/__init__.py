"""Runners: where the workers' processes come from."""

from millstream.runner.local import LocalRunner, RunSummary

__all__ = ["LocalRunner", "RunSummary"]
