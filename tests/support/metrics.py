"""Prometheus metrics as a test reads them: every sample an endpoint serves, and sums of
samples by name and labels."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample the endpoint serves, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (sample, have), value in samples.items()
        if sample == name and set(labels.items()) <= set(have)
    )
