"""Reading a scrape in the telemetry tests: every sample of ``GET /metrics`` by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from poolgate.shared.telemetry import names

EMBED = "/v1/embeddings"


async def samples(client) -> dict[tuple[str, frozenset], float]:
    resp = await client.get("/metrics")
    assert resp.status == 200 and resp.content_type == "text/plain"
    out = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(got: dict, name: str, **labels) -> float:
    if name == f"{names.REQUESTS}_total" or name.startswith(f"{names.REQUEST_DURATION}_"):
        labels.setdefault("protocol", "http")  # (the request series' protocol: these requests are HTTP's)
    return got[(name, frozenset(labels.items()))]


def total(got: dict, name: str, **labels) -> float:
    """Sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in got.items() if n == name and want <= ls)
