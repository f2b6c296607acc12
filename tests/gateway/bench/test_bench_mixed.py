"""``poolgate bench --model A --model B``: each model alone, then both at once, per-model tokens/s."""
from __future__ import annotations

import argparse

from poolgate.gateway.app import make_app
from poolgate.gateway.bench import cli
from poolgate.gateway.bench.load import LoadConfig
from poolgate.gateway.bench.mixed import alone_then_together, format_mixed, mixed_report, per_model
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

TEXTS = [f"text number {i} with some words" for i in range(24)]


async def test_each_model_alone_then_together(live_server):
    async with served_router([fake_model(name="a"), fake_model(name="b", dim=16)]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        cfgs = per_model(LoadConfig(url=url, model="a", batch_size=4, concurrency=2, warmup=1), ["a", "b"])
        alone, together = await alone_then_together(cfgs, TEXTS)
    report = mixed_report(cfgs, alone, together, corpus="test", num_texts=len(TEXTS))
    assert report["errors"] == 0 and [m["model"] for m in report["models"]] == ["a", "b"]
    for m in report["models"]:
        assert m["alone"]["inputs"] == m["together"]["inputs"] == len(TEXTS)
        assert m["alone"]["tokens_per_s"] > 0 and m["together_vs_alone"] > 0
    assert [m["together"]["embedding_dim"] for m in report["models"]] == [8, 16]  # each went to its own model
    assert report["together_tokens_per_s"] > 0
    table = format_mixed(report)
    assert "together/alone" in table and "\n  a " in table and "\n  b " in table


def test_several_models_refuse_the_single_model_extras():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--url", "http://127.0.0.1:9", "--model", "a", "--model", "b",
                              "--kill-worker-after", "1", "--gateway-pid", "1"])
    assert cli.main(args) == 2
