"""The packed fp32 CPU attention kernel (AVX2 + FMA) against the contract, and where the CPU backend picks it.

The kernel (kernels.cpu_attention_f32, called by ``packed_cpu_attention`` for fp32 q/k/v) is checked token by
token against ``reference_attention`` computed in float64, over mixed lengths (1, odd, around its 6-query and
16-key blocks, past 512), causal masks, windows and grouped-query heads, to 2e-6 absolute on unit-normal
inputs up to a head of 64, growing with the square root of the head dim past it (``tol``): fp32 rounding, the
order of grouped SDPA's own error in fp32 (asserted alongside). A score is one chain of head-dim FMAs, whose
rounding grows with its length: on an AMD EPYC Zen 4 a head of 256 measured 2.2e-6, grouped SDPA 0.7e-6.
It runs wherever the machine has AVX2 and FMA, so also under ``POOLGATE_CPU_CLASS=avx2`` (the suite's
CPU-class override).
"""
import os
import subprocess
import sys

import pytest
import torch

from poolgate.workers.batch.packing import pack
from poolgate.workers.kernels import cpu_attention, cpu_attention_f32
from poolgate.workers.kernels.attention import grouped_sdpa, reference_attention
from poolgate.workers.models.positions import RelativeBuckets

REASON = cpu_attention_f32.unavailable()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the fp32 CPU attention cannot run here: {REASON}")
LENGTHS = [1, 2, 5, 6, 7, 15, 16, 17, 31, 33, 85, 130, 3, 600]
CASES = [dict(), dict(causal=True), dict(window=(5, 3)), dict(causal=True, window=(7, 0)), dict(window=(0, 20))]
SHAPES = [(4, 4, 32), (4, 2, 64), (3, 1, 8), (2, 2, 40), (2, 1, 128), (2, 2, 256)]  # heads, kv heads, head dim
TOL = 2e-6


def tol(dim: int) -> float:
    """The bound for a head of ``dim``: ``TOL`` to 64, then with the square root of the dot product's length."""
    return TOL * max(1.0, (dim / 64) ** 0.5)


def _qkv(n, heads, kv_heads, dim, seed=0):
    """q, k, v as the three strided slices of one fused (n, 3, heads, dim) projection (kv: its first kv_heads)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, 3, heads, dim, generator=g)
    return qkv[:, 0], qkv[:, 1, :kv_heads], qkv[:, 2, :kv_heads]


def _exact(q, k, v, b, **kw):
    return reference_attention(q.double(), k.double(), v.double(), b, **kw).float()


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "full")
def test_kernel_matches_reference(heads, kv_heads, dim, case):
    b = pack([[1] * n for n in LENGTHS])  # with a group plan: grouped SDPA runs on the same batch
    q, k, v = _qkv(b.n_tokens, heads, kv_heads, dim)
    scale = dim ** -0.5
    got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=scale, **case)
    want = _exact(q, k, v, b, scale=scale, **case)
    sdpa = grouped_sdpa(q, k, v, b, scale=scale, **case)
    assert got.dtype == torch.float32 and got.shape == q.shape
    assert (got - want).abs().max().item() < tol(dim)
    assert (sdpa - want).abs().max().item() < tol(dim)  # the tolerance is fp32's, not the kernel's own


@needs_kernel
def test_the_kernel_itself_runs_not_sdpa():
    """The op is called for fp32 (not grouped SDPA: a batch without a group plan would make that raise)."""
    b = pack([[1] * n for n in LENGTHS], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 4, 32)
    got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2, causal=True)
    cu = b.cu_seqlens.to(torch.int32)
    direct = cpu_attention_f32.ATTEND(q, k, v, cu, 0.2, True, -1, -1, b.max_len, [0, len(LENGTHS) * 4])
    assert torch.equal(got, direct)
    assert (got - _exact(q, k, v, b, scale=0.2, causal=True)).abs().max().item() < TOL


@needs_kernel
def test_peaked_scores_rows_past_the_last_sequence_and_contiguous_inputs():
    """Scores far apart (exp2 underflows to 0 for most keys: no NaN, no denormal slowdown), q/k/v contiguous
    on their own, and a padded token bucket's extra rows: zeros."""
    lengths = [40, 9, 300]
    b = pack([[1] * n for n in lengths], group_attention=False)
    n = b.n_tokens + 5
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 2, 16, generator=g) * 9 for _ in range(3))
    got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=1.0)
    want = _exact(q, k, v, b, scale=1.0)
    # scores reach ~1,400, whose fp32 rounding alone moves the weights by ~1e-4: the bound is torch's own fp32
    # SDPA's error on the same inputs where that is larger (as the AVX2-capped ATen computes it, 3.8e-4)
    grouped = pack([[1] * n for n in lengths])
    sdpa = grouped_sdpa(q[:b.n_tokens], k[:b.n_tokens], v[:b.n_tokens], grouped, scale=1.0)
    bound = max(2e-5 * 9, 1.5 * (sdpa - want[:b.n_tokens]).abs().max().item())
    assert torch.isfinite(got).all() and (got - want).abs().max().item() < bound
    assert torch.equal(got[b.n_tokens:], torch.zeros(5, 2, 16))


@needs_kernel
def test_a_team_of_threads_splits_the_batch_and_agrees(monkeypatch):
    b = pack([[1] * n for n in LENGTHS], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 2, 64)
    one = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.125, causal=True)
    monkeypatch.setattr(cpu_attention, "SPLIT_WORK", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.125, causal=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, split)  # each (sequence, head) is computed the same way on whichever thread


def test_what_the_kernel_does_not_take_goes_where_it_is_exact():
    """A relative bias, a soft cap and masked keys take grouped SDPA; a head dim not a multiple of 8 runs SDPA
    (grouped with a plan, per sequence without): exact either way."""
    b = pack([[1] * n for n in LENGTHS])
    q, k, v = _qkv(b.n_tokens, 4, 4, 32)
    with torch.no_grad():
        bias = RelativeBuckets(heads=4, num_buckets=32, max_distance=128).for_length(b.max_len)
    for kw in (dict(bias=bias), dict(softcap=5.0)):
        got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2, **kw)
        assert (got - reference_attention(q, k, v, b, scale=0.2, **kw)).abs().max().item() < 1e-5
    masked = pack([[1] * n for n in LENGTHS], attend=[[i % 3 != 1 for i in range(n)] for n in LENGTHS])
    assert masked.key_masked
    got = cpu_attention.packed_cpu_attention(q, k, v, masked, scale=0.2)
    assert torch.equal(got, grouped_sdpa(q, k, v, masked, scale=0.2))
    q, k, v = _qkv(b.n_tokens, 2, 2, 12)
    for batch in (b, pack([[1] * n for n in LENGTHS], group_attention=False)):
        got = cpu_attention.packed_cpu_attention(q, k, v, batch, scale=0.3, causal=True)
        assert (got - _exact(q, k, v, batch, scale=0.3, causal=True)).abs().max().item() < TOL


def test_the_fake_traces_one_opaque_op_and_refuses_what_the_kernel_does_not_take():
    from torch.fx.experimental.proxy_tensor import make_fx

    b = pack([[1] * 5, [1] * 3], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 2, 32)

    def attend(q, k, v, cu):
        return cpu_attention_f32.ATTEND(q, k, v, cu, 0.2, False, -1, -1, 5, [0, 8])

    graph = make_fx(attend, tracing_mode="fake")(q, k, v, b.cu_seqlens.to(torch.int32))
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.poolgate.packed_attention_f32.default], calls
    with pytest.raises(ValueError, match="poolgate::packed_attention_f32 takes"):
        make_fx(attend, tracing_mode="fake")(q.bfloat16(), k.bfloat16(), v.bfloat16(), b.cu_seqlens.to(torch.int32))


def _backend_view(env_extra: dict[str, str]) -> list[str]:
    code = ("import torch; from poolgate.shared.config.cpu import apply_cpu_class; apply_cpu_class(); "
            "from poolgate.workers.backends.cpu import CpuBackend; b = CpuBackend(); "
            "print(b.attention(torch.float32).__name__, b.ops(torch.float32).plans_groups, "
            "b.ops(torch.float32).attention.__name__, sep='|'); print(b.kernels(torch.float32)['attention'])")
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    return out.stdout.strip().splitlines()


@needs_kernel
def test_the_cpu_backend_picks_it_for_fp32_without_a_group_plan_and_the_switch_forces_sdpa():
    from poolgate.workers.backends.cpu import CpuBackend

    b = CpuBackend()
    assert b.attention(torch.float32) is cpu_attention.packed_cpu_attention and not b.uses_groups(torch.float32)
    assert not b.ops(torch.float32).plans_groups
    assert b.kernels(torch.float32)["attention"] == "packed_cpu_attention (C, fp32, AVX2+FMA)"
    avx2 = _backend_view({"POOLGATE_CPU_CLASS": "avx2"})  # an AVX2-only CPU: the fp32 kernel all the same
    assert avx2 == ["packed_cpu_attention|False|packed_cpu_attention", "packed_cpu_attention (C, fp32, AVX2+FMA)"]
    sdpa = _backend_view({cpu_attention.MODE_ENV: "sdpa"})
    assert sdpa[0] == "grouped_sdpa|True|grouped_sdpa", sdpa
    assert sdpa[1] == f"grouped_sdpa ({cpu_attention.MODE_ENV}=sdpa)"


def test_no_avx2_means_grouped_sdpa():
    """The generic class (no AVX2/FMA shown): the kernel is not picked, and it says why."""
    view = _backend_view({"POOLGATE_CPU_CLASS": "generic"})
    assert view[0] == "grouped_sdpa|True|grouped_sdpa", view
    assert view[1] == "grouped_sdpa (the CPU lacks avx2, fma)", view
