"""IO-processor plugins on /pooling: found by entry point, a custom request in and a custom response out;
vLLM's "No IOProcessor plugin installed." without one, and its "Unsupported task: 'plugin'" first on a model without
that task. The plugin is the shipped example (sentence similarity),
installed for the test as pip would: a dist-info with its entry point on the path."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from poolgate.gateway.config.build import SettingError, plugin_name
from poolgate.gateway.dialects.io_processor import ENTRY_POINT_GROUP, NO_PLUGIN, installed, load_plugin
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import expected_vector

EXAMPLE = Path(__file__).parents[3] / "examples" / "io_processor_plugin"


@pytest.fixture
def example_installed(tmp_path, monkeypatch):
    dist = tmp_path / "poolgate_similarity_plugin-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: poolgate-similarity-plugin\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsimilarity = poolgate_similarity_plugin:plugin\n")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugin.cache_clear()
    yield
    load_plugin.cache_clear()


async def error_of(resp, status: int = 400) -> dict:
    assert resp.status == status, await resp.text()
    return (await resp.json())["error"]


async def test_without_a_plugin_a_plugin_request_gets_vllms_message(gateway):
    client = await gateway()
    data = await error_of(await client.post("/pooling", json={"data": {"source": "a", "sentences": ["b"]}}))
    assert data["message"] == NO_PLUGIN


@pytest.mark.parametrize("plugin", [None, "similarity"])
async def test_task_plugin_on_a_model_without_it_is_unsupported_before_any_plugin_check(gateway, example_installed,
                                                                                        plugin):
    client = await gateway(config=GatewayConfig(io_processor_plugin=plugin))
    err = await error_of(await client.post("/pooling", json={"input": "a b", "task": "plugin"}))
    assert err["message"] == "Unsupported task: 'plugin' Supported tasks: ('embed',)"
    assert err["type"] == "BadRequestError" and err["param"] == "task"


async def test_the_example_plugin_answers_its_own_request(gateway, example_installed):
    assert "similarity" in installed()
    client = await gateway(config=GatewayConfig(io_processor_plugin="similarity"))
    sentences = ["a b", "c d e", "a b c"]
    resp = await client.post("/pooling", json={"model": "fake-model", "data": {"source": "a b", "sentences": sentences}})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    source = expected_vector("a b")
    want = [float(expected_vector(s) @ source / (np.linalg.norm(expected_vector(s)) * np.linalg.norm(source)))
            for s in sentences]
    assert body["object"] == "io_processor" and body["model"] == "fake-model"
    np.testing.assert_allclose(body["data"]["similarities"], want, rtol=1e-5)
    assert body["data"]["similarities"][0] == pytest.approx(1.0, abs=1e-5)
    assert body["usage"]["prompt_tokens"] > 0 and body["id"] == f"pooling-{resp.headers['X-Request-Id']}"
    # the standard /pooling body still goes the standard way
    plain = await client.post("/pooling", json={"model": "fake-model", "input": "a b"})
    assert plain.status == 200 and (await plain.json())["object"] == "list"


async def test_data_the_plugin_cannot_take_is_its_400(gateway, example_installed):
    client = await gateway(config=GatewayConfig(io_processor_plugin="similarity"))
    err = await error_of(await client.post("/pooling", json={"data": {"source": "a b", "sentences": []}}))
    assert err["message"] == "data.sentences: a non-empty list of strings is required"


def test_a_plugin_that_is_not_installed_stops_start_up(example_installed):
    assert plugin_name(argparse.Namespace(io_processor_plugin="similarity")) == "similarity"
    with pytest.raises(SettingError, match=r"'nope' is not installed \(entry point group "
                                           r"poolgate\.io_processor_plugins; installed: .*similarity"):
        plugin_name(argparse.Namespace(io_processor_plugin="nope"))
