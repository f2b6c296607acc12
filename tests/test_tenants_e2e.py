"""Two tenants of an API keys file under shared load on a live `poolgate serve`: a bulk tenant (priority 10,
4 requests at once, 30,000 tokens a minute: it keeps the worker busy for the first seconds) sending big
requests faster than it may, beside an interactive tenant (priority 0, no quota it reaches) sending
one-input requests.

The bulk tenant is refused with 429 + Retry-After once over its quotas, and what it was admitted is
answered; the interactive tenant is never refused, and its p99 stays under ``INTERACTIVE_P99_S`` (the
issue's 1.5 s target for priority-0 requests beside priority-10 bulk work, with 1 s more for this shared
2-core machine, where the load client runs too). /metrics counts both by tenant name, never by key.
"""
from __future__ import annotations

import asyncio
import re

import requests

from poolgate.shared.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server
from tests.load_client import open_loop, percentile, texts

INTERACTIVE_KEY, BULK_KEY = "sk-interactive-0001", "sk-bulk-0000000001"
BULK_CONCURRENT, BULK_TOKENS_PER_MINUTE = 4, 30000
KEYS_FILE = f"""
[[tenants]]
name = "interactive"
keys = ["{INTERACTIVE_KEY}"]
priority = 0
max_concurrent = 16

[[tenants]]
name = "bulk"
keys = ["{BULK_KEY}"]
priority = 10
max_concurrent = {BULK_CONCURRENT}
tokens_per_minute = {BULK_TOKENS_PER_MINUTE}
"""
DURATION_S = 10.0
BULK_RATE, BULK_INPUTS = 8.0, 128
INTERACTIVE_RATE = 4.0
INTERACTIVE_P99_S = 2.5


def _body(n: int):
    return lambda: {"model": DEFAULT_MODEL_NAME, "input": texts(n), "encoding_format": "base64"}


async def _shared_load(url: str):
    endpoint = f"{url}/v1/embeddings"
    return await asyncio.gather(
        open_loop(endpoint, BULK_RATE, DURATION_S, _body(BULK_INPUTS), tag="bulk",
                  headers={"Authorization": f"Bearer {BULK_KEY}"}),
        open_loop(endpoint, INTERACTIVE_RATE, DURATION_S, _body(1), tag="interactive",
                  headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"}))


def _counter(metrics: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_two_tenants_with_different_quotas_and_priorities_under_shared_load(tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_FILE)
    with live_server(tmp_path, "--api-keys-file", str(keys)) as server:
        for key in (BULK_KEY, INTERACTIVE_KEY):  # warm-up (the worker measures its rate), and both keys work
            r = requests.post(f"{server.url}/v1/embeddings", json=_body(8)(), timeout=60,
                              headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        bulk, interactive = asyncio.run(_shared_load(server.url))

        fast = [o.latency_s for o in interactive if o.status == 200]
        bulk_ok = [o for o in bulk if o.status == 200]
        bulk_429 = [o for o in bulk if o.status == 429]
        p99 = percentile(fast, 0.99)
        print(f"tenants: bulk offered {len(bulk)} x {BULK_INPUTS} inputs ({BULK_RATE:g}/s): {len(bulk_ok)} answered, "
              f"{len(bulk_429)} refused (429), p50 {percentile([o.latency_s for o in bulk_ok], 0.5):.2f}s; "
              f"interactive {len(interactive)} x 1 input: {len(fast)} answered, p50 {percentile(fast, 0.5):.3f}s "
              f"p99 {p99:.3f}s")

        assert [o.status for o in interactive] == [200] * len(interactive), [
            str(o.body)[:300] for o in interactive if o.status != 200]
        assert p99 <= INTERACTIVE_P99_S
        assert len(bulk_ok) + len(bulk_429) == len(bulk), [
            str(o.body)[:200] for o in bulk if o.status not in (200, 429)]
        assert bulk_429 and bulk_ok
        assert all(len(o.body["data"]) == BULK_INPUTS for o in bulk_ok)
        for o in bulk_429:
            assert o.retry_after is not None and 1 <= int(o.retry_after) <= 60, o.retry_after
            assert "Tenant 'bulk'" in o.body["error"]["message"], o.body

        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert BULK_KEY not in metrics and INTERACTIVE_KEY not in metrics
        tenant_requests = "poolgate_tenant_requests_total"
        assert _counter(metrics, tenant_requests, tenant="bulk", status="429") == len(bulk_429)
        assert _counter(metrics, tenant_requests, tenant="bulk", status="200") == len(bulk_ok) + 1
        assert _counter(metrics, tenant_requests, tenant="interactive", status="200") == len(interactive) + 1
        reasons = {r: _counter(metrics, "poolgate_admission_rejections_total", reason=r)
                   for r in ("tenant_concurrency", "tenant_tokens", "tenant_requests", "queue_full")}
        print(f"tenants: refusals by reason {reasons}")
        assert reasons["tenant_concurrency"] + reasons["tenant_tokens"] == len(bulk_429)  # its quotas, not the pool's
        # Which of its two quotas bites first depends on this machine's speed (the tokens quota is charged up front,
        # so a fast start can use it up before four calls are ever in flight): each is unit-tested on its own
        # (tests/gateway/http/test_tenants.py); here the bulk tenant must have been held back by its own quotas.
        assert len(bulk_429) > 0
        answered = sum(o.body["usage"]["prompt_tokens"] for o in bulk_ok)
        # A request reserves its estimated tokens (chars/4 + 2 an input) before it runs and is charged its
        # real count once pooled; the bucket admits while not in debt. So: a minute's worth, the refill over
        # the load, and the requests in flight together going past their estimates: at most BULK_CONCURRENT
        # requests over.
        one = max(o.body["usage"]["prompt_tokens"] for o in bulk_ok)
        assert answered <= BULK_TOKENS_PER_MINUTE * (1 + DURATION_S / 60) + BULK_CONCURRENT * one
        tokens = sum(o.body["usage"]["prompt_tokens"] for o in interactive)
        warm_tokens = _counter(metrics, "poolgate_tenant_prompt_tokens_total", tenant="interactive") - tokens
        assert 8 <= warm_tokens <= 8 * 64  # the warm-up's 8 inputs, plus exactly the load's tokens
