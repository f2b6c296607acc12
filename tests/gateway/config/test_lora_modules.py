"""``--lora-modules``: vLLM's item forms reach the config, wrong ones are refused by name, and the adapters are
served once the workers are up (a real tiny BERT worker with ``--max-loras``)."""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.build import SettingError
from poolgate.gateway.launch import Lifecycle
from poolgate.shared.config.frozen import GatewayConfig, LoraModule
from tests.gateway.conftest import served_router


def config_of(*items: str):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return serve.config_from_args(parser.parse_args([a for item in items for a in ("--lora-modules", item)]), {})


def test_each_item_form_reaches_the_config(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for folder in (a, b, c):
        folder.mkdir()
    cfg = config_of(f"x={a}", json.dumps({"name": "y", "path": str(b), "base_model_name": "m"}),
                    json.dumps([{"name": "z", "path": str(c)}]))
    assert cfg.lora_modules == (LoraModule("x", str(a)), LoraModule("y", str(b), "m"), LoraModule("z", str(c)))


@pytest.mark.parametrize("item, why", [
    ("{nope", "neither NAME=PATH nor JSON"),
    ('{"name": "x"}', "a name and a path are required"),
    ("x=/no/such/folder", "is not a folder"),
    ('{"name": "x", "path": "/tmp", "is_3d_lora_weight": true}', "unknown keys"),
])
def test_wrong_items_are_refused_by_name(item, why):
    with pytest.raises(SettingError, match=why):
        config_of(item)


def test_a_name_given_twice_is_refused(tmp_path):
    with pytest.raises(SettingError, match="given twice"):
        config_of(f"x={tmp_path}", f"x={tmp_path}")


async def test_the_adapters_are_served_once_the_workers_are_up(tmp_path):
    pytest.importorskip("peft")
    from tests.gateway.test_lora_routes import served
    from tests.fakes import make_tiny_checkpoint
    from tests.workers.models.test_run_loras import BERT_TARGETS, make_adapter

    make_tiny_checkpoint(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "a0", BERT_TARGETS, seed=1)
    config = GatewayConfig(lora_modules=(LoraModule("a0", str(tmp_path / "a0")),))
    async with served_router([served(tmp_path / "base")]) as router:
        lifecycle = Lifecycle(config, router, signals=False)
        lifecycle.site_listening("")
        task = asyncio.create_task(lifecycle._bring_up())
        await asyncio.wait_for(lifecycle.ready.wait(), 30)
        task.cancel()
        shutil.rmtree(lifecycle.folder, ignore_errors=True)
        assert not lifecycle.failed
        assert router.loras["a0"].parent == "base" and router.lora_of("a0") == "a0"
