"""bench.get_rows_calls measures real calls on loopback, with and without Hold."""

from __future__ import annotations

from bench.get_rows_calls import measure


def test_measure_reports_per_call_figures_for_both_servers() -> None:
    for held in (0, 8):
        figures = measure(held, calls=20, pause=0.0)
        assert set(figures) == {"wall_us", "client_cpu_us", "server_cpu_us"}
        assert all(value > 0 for value in figures.values()), figures
