"""The Triton kernels compiled for a real GPU (``pytest -m cuda tests/workers/kernels/gpu``; ``.ci/gpu-check`` runs
it): each against its torch reference on the GPU, and a packed BERT and Llama built with ``triton_ops`` against
the reference bundle. The interpreter tests beside this file check the same kernels on the CPU in every CI run."""
import pytest
import torch

from poolgate.workers.batch.packing import pack, to_device
from poolgate.workers.kernels import pooling
from poolgate.workers.kernels.gpu import ops as gpu_ops
from poolgate.workers.kernels.gpu import pool as gpu_pool
from poolgate.workers.kernels.gpu.gelu import triton_linear
from poolgate.workers.kernels.gpu.normalize import l2_cut
from poolgate.workers.kernels.gpu.norm import triton_layer_norm, triton_rms_norm
from poolgate.workers.kernels.gpu.rope import triton_rope
from poolgate.workers.kernels.linear import Linear
from poolgate.workers.kernels.norm import LayerNorm, RMSNorm
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.kernels.rope import apply_rope
from tests.fakes import make_tiny_checkpoint
from tests.workers.kernels.gpu.test_models import SEQS
from tests.workers.models.test_decoder_golden import save_tiny

pytestmark = pytest.mark.cuda
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# a GPU rounds to nearest in every dtype (the interpreter truncates bf16): one step of the dtype, fp32 statistics
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 2 ** -7)}


def _close(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    atol, rtol = TOL[want.dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_on_the_gpu(dtype):
    torch.manual_seed(0)
    for dim in (384, 768, 1000):
        ref = LayerNorm(dim, eps=1e-12).cuda()
        with torch.no_grad():
            ref.weight.normal_(), ref.bias.normal_()
        tri = triton_layer_norm(dim, 1e-12, True).cuda()
        tri.load_state_dict(ref.state_dict())
        x, r = (torch.randn(2, 4099, dim, device="cuda") * 3).to(dtype)
        _close(tri.to(dtype)(x.clone(), r), ref.to(dtype)(x, r))
        for gemma in (False, True):
            rref = RMSNorm(dim, 1e-6, gemma).cuda()
            with torch.no_grad():
                rref.weight.normal_()
            rtri = triton_rms_norm(dim, 1e-6, gemma).cuda()
            rtri.load_state_dict(rref.state_dict())
            _close(rtri.to(dtype)(x), rref.to(dtype)(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "gelu_pytorch_tanh", "relu", "silu"])
def test_linear_epilogue_on_the_gpu(dtype, activation):
    torch.manual_seed(1)
    ref = Linear(384, 1536, activation=activation).cuda().to(dtype)
    tri = triton_linear(384, 1536, True, activation).cuda().to(dtype)
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(3001, 384, device="cuda", dtype=dtype)
    # the same GEMM on both sides; only the epilogue differs
    _close(tri(x), ref(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rot", [(64, 64), (128, 128), (80, 32)])
def test_rope_on_the_gpu(dtype, head_dim, rot):
    torch.manual_seed(2)
    n = 5003
    pos = torch.arange(n, device="cuda").remainder(700).float()[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, device="cuda").float() / rot))
    ang = torch.cat([pos * inv, pos * inv], -1)[:, None, :]
    x = torch.randn(n, 8, head_dim, device="cuda", dtype=dtype)
    _close(triton_rope(x.clone(), ang.cos(), ang.sin()), apply_rope(x, ang.cos(), ang.sin()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pooling_and_l2_cut_on_the_gpu(dtype):
    torch.manual_seed(3)
    batch = _to_cuda(pack([[1] * n for n in (1, 7, 512, 33, 2048, 5)]))
    hidden = torch.randn(int(batch.cu_seqlens[-1]), 768, device="cuda", dtype=dtype)
    for name in ("CLS", "LAST", "MEAN", "ALL"):
        got = gpu_pool.triton_pooling(REFERENCE).pooling[name](hidden, batch)
        want = pooling.POOLING[name](hidden, batch)
        torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=1e-5)
    pooled = torch.randn(300, 1024, device="cuda")
    for dims in (None, 256):
        torch.testing.assert_close(l2_cut(pooled, dims, True), REFERENCE.l2_cut(pooled, dims, True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_packed_models_with_the_kernels_on_the_gpu(tmp_path, dtype):
    """A packed BERT and a Llama with every Triton kernel in, against the reference bundle, on the GPU."""
    make_tiny_checkpoint(tmp_path / "bert")
    save_tiny(tmp_path / "llama", "llama", "LlamaModel", num_hidden_layers=2)
    for folder in (tmp_path / "bert", tmp_path / "llama"):
        _, want = _on_gpu(folder, REFERENCE, dtype)
        _, got = _on_gpu(folder, gpu_ops.triton_ops(REFERENCE, dtype), dtype)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def _to_cuda(batch):
    return to_device(batch, torch.device("cuda"))


def _on_gpu(folder, ops, dtype):
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.load.st_config import read_spec
    from poolgate.workers.models import build_model

    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    model, _ = build_model(spec, ops, allow_pickle=False)
    model = model.to("cuda", dtype)
    with torch.inference_mode():
        return model, model(_to_cuda(pack(SEQS)))
