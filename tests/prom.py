"""Reading a Prometheus exposition in tests: samples by name and labels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: ``(name, labels, value)``."""
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a server's ``/metrics``."""
    return samples(httpx.get(url + "/metrics", timeout=30).text)


def value(got: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of sample ``name``'s values over the label sets that have ``labels``."""
    return sum(
        v for n, ls, v in got if n == name and all(ls.get(k) == x for k, x in labels.items())
    )


def has(got: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> bool:
    """Whether some sample ``name`` has ``labels``."""
    return any(n == name and all(ls.get(k) == x for k, x in labels.items()) for n, ls, _ in got)
