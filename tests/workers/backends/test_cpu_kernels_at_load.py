"""The CPU backend builds its C kernels while the model loads, never in a request, and says at start what runs.

``CpuBackend.optimize`` builds (or finds) the packed attention for each head dim the model attends with before
any forward; a head dim that does not build, or that the kernel does not take, is named in
``kernels(dtype)["attention"]`` and so in the start-up table, logged before the warm-up. Tiny random BERTs
give the head dims: 48 (the AVX512-BF16 build even on AMX: not a multiple of 32) and 24 (not a multiple of 16).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModel, BertConfig

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.kernels import cpu_attention, cpu_attention_f32
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.models import build_model
from tests.fakes import save_random

REASON = cpu_attention.unavailable()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"packed CPU attention cannot run here: {REASON}")


def _bert(folder, head_dim: int, heads: int = 2) -> WorkerConfig:
    config = BertConfig(vocab_size=100, hidden_size=head_dim * heads, num_hidden_layers=2, num_attention_heads=heads,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    save_random(folder, AutoModel, config)
    return WorkerConfig(model=str(folder), served_model_name="m", backend="cpu", dtype="bfloat16",
                        max_batch_tokens=256)


def _built(cfg: WorkerConfig, backend: CpuBackend, dtype=torch.bfloat16):
    model, _ = build_model(read_spec(cfg), backend.ops(dtype), allow_pickle=False)
    return model.to(dtype)


@pytest.fixture
def loads(monkeypatch):
    """``seen``: the head dims ``cbuild.load`` is asked for (each once: ``_loaded`` starts empty); a head dim
    in ``fail`` fails as a compiler would. ``seen_f32``: the same for the fp32 kernel (``cpu_attention_f32``)."""
    loads = SimpleNamespace(seen=[], seen_f32=[], fail=set())
    real = cpu_attention.cbuild.load

    def spy(source, flags, tag="", *rest):
        if source == cpu_attention_f32.SOURCE:
            loads.seen_f32.append(int(tag.removeprefix("_hd")))
        if source == cpu_attention.SOURCE:
            head_dim = int(tag.removeprefix("_hd").removesuffix("_amx"))
            loads.seen.append(head_dim)
            if head_dim in loads.fail:
                raise RuntimeError(f"cc failed on packed_attention.c: (a test, head dim {head_dim})")
        return real(source, flags, tag, *rest)

    monkeypatch.setattr(cpu_attention.cbuild, "load", spy)
    cpu_attention._loaded.cache_clear()
    cpu_attention_f32.loaded.cache_clear()
    yield loads
    cpu_attention._loaded.cache_clear()
    cpu_attention_f32.loaded.cache_clear()


@needs_kernel
def test_the_models_head_dim_is_built_at_load_not_in_the_first_forward(tmp_path, loads):
    from poolgate.workers.batch.packing import pack

    backend, cfg = CpuBackend(), _bert(tmp_path, 48)
    model = _built(cfg, backend)
    assert 48 not in loads.seen  # building the model built nothing for it
    backend.optimize(model, torch.bfloat16)
    assert loads.seen.count(48) == 1
    assert backend.kernels(torch.bfloat16)["attention"] == "packed_cpu_attention (C, AVX512-BF16)"
    with torch.inference_mode():
        model(pack([[5, 6, 7], [8, 9]], group_attention=False))
    assert loads.seen.count(48) == 1  # the forward found it loaded


@needs_kernel
def test_a_head_dim_that_does_not_build_is_in_the_report_before_any_request(tmp_path, loads):
    loads.fail.add(48)
    backend, cfg = CpuBackend(), _bert(tmp_path, 48)
    backend.optimize(_built(cfg, backend), torch.bfloat16)
    assert backend.kernels(torch.bfloat16)["attention"] == (
        "SDPA per sequence for head dim 48 (no build for head dim 48: cc failed on packed_attention.c: (a test, "
        "head dim 48))")


@needs_kernel
def test_a_head_dim_the_kernel_does_not_take_is_in_the_report(tmp_path, loads):
    backend, cfg = CpuBackend(), _bert(tmp_path, 24)
    backend.optimize(_built(cfg, backend), torch.bfloat16)
    assert 24 not in loads.seen
    assert backend.kernels(torch.bfloat16)["attention"] == (
        "SDPA per sequence for head dim 24 (the kernel takes head dims of 16 to 256 in steps of 16, not 24)")


def test_a_float32_model_builds_the_fp32_attention_only(tmp_path, loads):
    """fp32: no bf16 build; the fp32 kernel's for the model's head dim where AVX2 runs it, else grouped SDPA."""
    backend, cfg = CpuBackend(), _bert(tmp_path, 48)
    backend.optimize(_built(cfg, backend, torch.float32), torch.float32)
    assert loads.seen == []
    if cpu_attention_f32.unavailable() is None:
        assert loads.seen_f32 == [48]
        assert backend.kernels(torch.float32)["attention"] == "packed_cpu_attention (C, fp32, AVX2+FMA)"
    else:
        assert loads.seen_f32 == [] and backend.kernels(torch.float32)["attention"].startswith("grouped_sdpa (")


@needs_kernel
def test_the_start_up_table_says_a_failed_build_before_the_warm_up(tmp_path, loads, caplog):
    from poolgate.workers.load.build import load_model

    loads.fail.add(48)
    with caplog.at_level(logging.INFO, logger="poolgate.worker"):
        info = load_model(_bert(tmp_path, 48)).info
    logged = [r.getMessage() for r in caplog.records if r.name == "poolgate.worker"]
    (row,) = [i for i, line in enumerate(logged) if line.startswith("kernels")]
    assert "attention: SDPA per sequence for head dim 48 (no build for head dim 48: cc failed" in logged[row]
    assert row < min(i for i, line in enumerate(logged) if line.startswith("warming up"))
    assert info.kernels["attention"].startswith("SDPA per sequence for head dim 48")
    assert loads.seen.count(48) == 1
