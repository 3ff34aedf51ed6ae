"""Runnable millstream jobs used by the README, the tests and the benchmarks."""
