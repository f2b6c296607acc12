"""Tenants: keys found in constant time among digests, quotas as buckets, 429 with Retry-After, one log line."""
from __future__ import annotations

import hashlib
import logging

import pytest

from poolgate.gateway.http.tenants import DEFAULT_TENANT, Bucket, Tenants
from poolgate.shared.config.frozen import GatewayConfig, Tenant
from poolgate.shared.domain.errors import Overloaded


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenants(*tenant: Tenant, api_key: str | None = None, clock=None) -> Tenants:
    return Tenants(GatewayConfig(api_key=api_key, tenants=tenant), clock=clock or Clock())


def test_a_key_finds_its_tenant_and_only_the_main_key_is_admin():
    t = tenants(Tenant("search", (sha("sk-a"), sha("sk-b"))), Tenant("bulk", (sha("sk-c"),)), api_key="sk-main")
    assert t.enabled and t.identify("sk-b").name == "search" and t.identify("sk-c").name == "bulk"
    main = t.identify("sk-main")
    assert main.name == DEFAULT_TENANT and main.admin and not t.identify("sk-a").admin
    assert t.identify("sk-d") is None and t.identify("") is None and t.identify("sk-\udcff") is None
    assert not tenants().enabled


def test_requests_per_minute_refill_continuously_and_retry_after_says_when():
    clock = Clock()
    state = tenants(Tenant("a", (sha("k"),), requests_per_minute=2), clock=clock).identify("k")
    state.admit(), state.leave(), state.admit(), state.leave()
    with pytest.raises(Overloaded) as refused:
        state.admit()
    assert refused.value.reason == "tenant_requests" and refused.value.retry_after_s == 30.0  # 1 per 30 s
    clock.now += 30
    state.admit()


def test_counted_tokens_are_charged_before_the_request_runs_and_a_429_names_them():
    clock = Clock()
    state = tenants(Tenant("a", (sha("k"),), tokens_per_minute=600), clock=clock).identify("k")
    state.admit()
    state.take_tokens(400)  # counted by the tokenizer, taken before it is queued
    with pytest.raises(Overloaded, match=r"600 tokens per minute \(this request has 300 tokens\)") as refused:
        state.take_tokens(300)  # 200 left: a concurrent request cannot spend the same tokens
    assert refused.value.reason == "tenant_tokens" and refused.value.retry_after_s == 10.0  # 100 more at 10/s
    state.give_back(400)  # the pools refused the first before it ran
    state.take_tokens(300)
    state.leave()


def test_a_request_bigger_than_a_minute_needs_a_full_bucket_and_leaves_it_in_debt():
    clock = Clock()
    state = tenants(Tenant("a", (sha("k"),), tokens_per_minute=600), clock=clock).identify("k")
    state.admit()
    state.take_tokens(900)  # a full bucket: 300 in debt
    state.leave()
    with pytest.raises(Overloaded) as refused:
        state.admit()  # in debt: refused before its inputs are even tokenized
    assert refused.value.reason == "tenant_tokens" and refused.value.retry_after_s == 30.0  # 300 at 10/s
    clock.now += 31
    state.admit()


def test_concurrency_cap():
    state = tenants(Tenant("a", (sha("k"),), max_concurrent=1)).identify("k")
    state.admit()
    with pytest.raises(Overloaded, match="1 requests in flight at once") as refused:
        state.admit()
    assert refused.value.reason == "tenant_concurrency"
    state.leave()
    state.admit()


def test_over_quota_is_logged_once_until_under_it_again(caplog):
    state = tenants(Tenant("nightly", (sha("k"),), max_concurrent=1)).identify("k")
    state.admit()
    with caplog.at_level(logging.WARNING, logger="poolgate.gateway.tenants"):
        for _ in range(5):
            with pytest.raises(Overloaded):
                state.admit()
        state.leave()
        state.admit()  # under quota again: the next refusal is news
        with pytest.raises(Overloaded):
            state.admit()
    lines = [r.message for r in caplog.records]
    assert len(lines) == 2 and "tenant nightly is over its quota" in lines[0] and "k" not in lines[0].split()


def test_a_bucket_never_holds_more_than_a_minute():
    clock = Clock()
    bucket = Bucket(60, clock)
    clock.now += 3600
    assert bucket.refill() == 60 and bucket.wait_s(61) == pytest.approx(1.0)


def test_a_429_carries_its_own_retry_after_else_one_second():
    from poolgate.gateway.http.middleware import _retry_after
    from poolgate.shared.domain.errors import Unavailable

    assert _retry_after(Overloaded("full", retry_after_s=2.6)) == "3"
    assert _retry_after(Overloaded("full", retry_after_s=0.2)) == "1"
    assert _retry_after(Overloaded("full")) == "1" and _retry_after(Unavailable("gone")) == "1"
