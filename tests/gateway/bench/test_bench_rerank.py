"""``poolgate bench-rerank`` against a live app over a real (fake-model) worker."""
from __future__ import annotations

import argparse

import pytest

from poolgate.gateway.app import make_app
from poolgate.gateway.bench import rerank
from poolgate.gateway.bench.load import BadResponse
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router


def args(url: str, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    rerank.add_arguments(parser)
    ns = parser.parse_args(["--url", url])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


async def test_every_timed_request_is_checked_and_timed(live_server):
    async with served_router([fake_model(tasks=("classify",), num_labels=1, dim=1, max_model_len=512,
                                         max_batch_tokens=4096)]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        docs = [f"document number {i} about things" for i in range(40)]
        report = await rerank.run(args(url, documents=12, requests=5, warmup=1, concurrency=2), "fake-model", docs)
    assert report["ok"] == 5 and report["errors"] == 0 and report["documents"] == 12
    assert 0 < report["p50_ms"] <= report["p99_ms"] and report["documents_per_s"] > 0


def test_a_response_out_of_order_is_an_error():
    good = {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}
    rerank.check(good, 2)
    with pytest.raises(BadResponse, match="sorted"):
        rerank.check({"results": good["results"][::-1]}, 2)
    with pytest.raises(BadResponse, match="expected 3 results"):
        rerank.check(good, 3)
