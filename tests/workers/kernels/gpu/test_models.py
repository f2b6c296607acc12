"""Tiny packed models built with ``triton_ops`` under the interpreter give the reference bundle's outputs, and
the GPU backends put the kernels in their bundle or say why not."""
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.backends.cuda import CudaBackend, RocmBackend
from poolgate.workers.backends.xpu import XpuBackend
from poolgate.workers.batch.packing import pack
from poolgate.workers.kernels import gpu
from poolgate.workers.kernels.attention import grouped_sdpa
from poolgate.workers.kernels.gpu import ops as gpu_ops
from poolgate.workers.kernels.gpu.gelu import TritonLinear
from poolgate.workers.kernels.gpu.norm import TritonLayerNorm, TritonRMSNorm
from poolgate.workers.kernels.ops import REFERENCE, Ops
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.models import build_model
from tests.fakes import make_tiny_checkpoint
from tests.workers.models.test_decoder_golden import save_tiny

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [7], [2, 9, 8, 7, 6, 9, 8, 7, 6, 3]]


def _hidden(folder, ops: Ops, dtype=torch.float32) -> tuple[torch.nn.Module, torch.Tensor]:
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    model, _ = build_model(spec, ops, allow_pickle=False)
    model = model.to(dtype)  # built once in fp32, then cast (as --dtype auto does)
    with torch.inference_mode():
        return model, model(pack(SEQS))  # (n_tokens, hidden)


def test_a_packed_bert_runs_the_kernels_and_matches_the_reference(tmp_path, launches):
    make_tiny_checkpoint(tmp_path)  # hidden 32, 2 layers, GELU
    _, want = _hidden(tmp_path, REFERENCE)
    seen = launches()
    model, got = _hidden(tmp_path, gpu_ops.triton_ops(REFERENCE, torch.float32))
    assert any(isinstance(m, TritonLayerNorm) for m in model.modules())
    assert sum(isinstance(m, TritonLinear) and m.activation == "gelu" for m in model.modules()) == 2
    # the embedding norm and two a layer; one GELU epilogue a layer; the norms' residual add fused
    assert seen["norm_rows"].count == 5 and seen["bias_act"].count == 2
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case,dtype", [("llama", torch.float32), ("qwen3", torch.float32),  # qwen3: q/k norms
                                        ("llama", torch.float16)])  # over head views, head_dim 32
def test_a_packed_decoder_runs_the_kernels_and_matches_the_reference(tmp_path, launches, case, dtype):
    extra = {"head_dim": 32} if case == "qwen3" else {}
    save_tiny(tmp_path, case, f"{case.capitalize()}Model", num_hidden_layers=2, **extra)
    _, want = _hidden(tmp_path, Ops(attention=grouped_sdpa), dtype)
    seen = launches()
    model, got = _hidden(tmp_path, gpu_ops.triton_ops(Ops(attention=grouped_sdpa), torch.float32), dtype)
    assert any(isinstance(m, TritonRMSNorm) for m in model.modules())
    norms = 2 * (2 + (2 if case == "qwen3" else 0)) + 1  # two a layer (+ q and k norms), the final one
    assert seen["norm_rows"].count == norms and seen["rope"].count == 2 * 2
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2  # fp16: a rounding step here and there, two layers
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_the_gpu_backends_put_triton_in_or_say_why(monkeypatch):
    """Called directly (no GPU here): the bundle and the report with triton, then with POOLGATE_TRITON=off."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv(gpu.OFF_ENV, raising=False)
    gpu.unavailable.cache_clear()
    try:
        for backend in (CudaBackend(), RocmBackend(), XpuBackend()):
            ops = backend.ops(torch.float16)
            assert ops.layer_norm is gpu_ops.triton_layer_norm and ops.rms_norm is gpu_ops.triton_rms_norm
            assert ops.linear is gpu_ops.triton_linear and ops.rope is gpu_ops.triton_rope
            assert ops.attention is backend.attention(torch.float16)  # the library's attention stays
            report = backend.kernels(torch.float16)
            assert report["layer_norm"].startswith("Triton norm_rows") and report["rope"].startswith("Triton rope")
            assert report["linear"].startswith("torch GEMM, then Triton bias_act")
        for backend in (CudaBackend(), RocmBackend(), XpuBackend()):  # the library's attention, said so
            name = backend.attention(torch.float16).__name__
            assert backend.kernels(torch.float16)["attention"] == gpu_ops.ATTENTION[name]
        assert RocmBackend().kernels(torch.float16)["attention"] == gpu_ops.ATTENTION["grouped_sdpa"]
        assert CudaBackend().kernels(torch.float64)["rms_norm"] == (
            "torch (float64: the kernels take float32, float16 and bfloat16)")
        monkeypatch.setenv(gpu.OFF_ENV, "off")
        gpu.unavailable.cache_clear()
        for backend in (CudaBackend(), RocmBackend(), XpuBackend()):
            ops = backend.ops(torch.bfloat16)
            assert (ops.layer_norm, ops.rms_norm, ops.linear, ops.rope) == (
                REFERENCE.layer_norm, REFERENCE.rms_norm, REFERENCE.linear, REFERENCE.rope)
            report = backend.kernels(torch.bfloat16)
            assert {report[op] for op in gpu_ops.KERNELS} == {"torch (POOLGATE_TRITON=off)"}
    finally:
        gpu.unavailable.cache_clear()
