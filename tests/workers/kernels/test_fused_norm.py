"""The fused residual add + LayerNorm kernel against torch's LayerNorm of the bf16 sum."""
import pytest
import torch

from poolgate.workers.kernels import fused_norm
from poolgate.workers.kernels.norm import LayerNorm

REASON = fused_norm.unavailable()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the fused LayerNorm cannot run here: {REASON}")


def _pair(dim, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = LayerNorm(dim, eps=1e-12, bias=bias)
    with torch.no_grad():
        ref.weight.normal_()
        if bias:
            ref.bias.normal_()
    ref = ref.to(torch.bfloat16)
    fused = fused_norm.FusedLayerNorm(dim, eps=1e-12, bias=bias).to(torch.bfloat16)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


@needs_kernel
@pytest.mark.parametrize("dim,bias,residual", [(384, True, True), (768, False, True), (16, True, False),
                                               (1024, True, True)])
def test_matches_the_reference_within_a_bf16_step(dim, bias, residual):
    ref, fused = _pair(dim, bias)
    x = (torch.randn(257, dim) * 3).to(torch.bfloat16)
    r = torch.randn(257, dim).to(torch.bfloat16) if residual else None
    with torch.inference_mode():
        want, got = ref(x, r), fused(x, r)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    diff = (got.float() - want.float()).abs()
    assert diff.max().item() <= 2 * want.float().abs().max().item() / 128  # at most a bf16 step or two
    assert (got == want).float().mean().item() > 0.999  # almost every element bit-equal


@needs_kernel
def test_new_weights_are_read_again_and_threads_split_rows(monkeypatch):
    ref, fused = _pair(64)
    x = torch.randn(fused_norm.SPLIT_ROWS + 5, 64).to(torch.bfloat16)
    with torch.inference_mode():
        fused(x)
        with torch.no_grad():
            fused.weight.mul_(2)
            ref.weight.mul_(2)
        one = fused(x)
        assert torch.equal(one, ref(x)) or (one.float() - ref(x).float()).abs().max() < 0.05
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
        assert torch.equal(fused(x), one)


def test_what_the_kernel_does_not_take_runs_the_reference():
    ref, fused = _pair(24)  # not a multiple of 16
    x = torch.randn(5, 24).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(fused(x, x), ref(x, x))
        ref32, fused32 = _pair(32)
        x32 = torch.randn(2, 3, 32)  # fp32, three dims
        assert torch.equal(fused32.float()(x32), ref32.float()(x32))


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3])
def test_overwrite_x_writes_the_same_result_over_x_and_nothing_else(monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    ref, fused = _pair(384)
    x = (torch.randn(fused_norm.SPLIT_ROWS + 7, 384) * 3).to(torch.bfloat16)  # rows past the prefetch's reach too
    r = torch.randn_like(x)
    with torch.inference_mode():
        want = fused(x, r)
        r_before, x_alias = r.clone(), x.clone()
        got = fused(x_alias, r, overwrite_x=True)
        assert got.data_ptr() == x_alias.data_ptr() and torch.equal(got, want)
        assert torch.equal(r, r_before)
        assert torch.equal(fused(want.clone(), None, overwrite_x=True), fused(want, None))  # no residual
        assert torch.equal(ref(x, r, overwrite_x=True), ref(x, r))  # the reference leaves x alone
        assert not torch.equal(x, want)
        row = torch.randn(1, 384).to(torch.bfloat16).expand(4, 384)  # rows sharing storage: never written over
        out = fused(row, None, overwrite_x=True)
        assert out.data_ptr() != row.data_ptr() and torch.equal(out, fused(row.contiguous(), None))


def test_the_kernel_is_one_opaque_torch_op_that_writes_its_out():
    """``poolgate::add_layer_norm`` traced on fake tensors is one node that writes ``out``, and a call it cannot
    take is refused while tracing, so a compiled graph never hands it to the C code."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 32).to(torch.bfloat16)
    w, b = torch.ones(32), torch.zeros(32)

    def norm(x, w, b):
        out = torch.empty_like(x)
        fused_norm.ADD_LAYER_NORM(x, x, w, b, 1e-5, out, [0, 4])
        return out

    graph = make_fx(norm, tracing_mode="fake")(x, w, b)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.poolgate.add_layer_norm.default in calls, calls
    for bad in ((x, w[:16], b), (x.float(), w, b), (x, w.to(torch.bfloat16), b)):
        with pytest.raises(ValueError, match="poolgate::add_layer_norm takes"):
            make_fx(norm, tracing_mode="fake")(*bad)
