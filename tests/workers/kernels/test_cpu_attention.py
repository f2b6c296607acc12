"""The packed CPU attention kernel (AVX512-BF16, and AMX where the CPU has it) against the contract.

Each build the machine can run (kernels.cpu_attention builds them with the C compiler) is checked token by
token against ``reference_attention`` (fp32, one sequence at a time), over mixed lengths (1, odd, around the
16- and 32-key blocks, longer than a block of queries), causal masks, windows and grouped-query heads, with
an error no bigger than grouped SDPA's in the same dtype. The fallbacks (a bias, a soft cap, masked keys,
a head dimension the kernel does not take) and the split of one batch over threads are checked too.
"""
import ctypes

import pytest
import torch

from poolgate.workers.batch.packing import pack
from poolgate.workers.kernels import cpu_attention
from poolgate.workers.kernels.attention import grouped_sdpa, reference_attention
from poolgate.workers.models.positions import RelativeBuckets

REASON = cpu_attention.unavailable()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"packed CPU attention cannot run here: {REASON}")
LENGTHS = [1, 2, 15, 16, 17, 31, 33, 85, 130, 7, 230]  # 230: past AVX512_MAX_LEN, SDPA on that build on Intel
CASES = [dict(), dict(causal=True), dict(window=(5, 3)), dict(causal=True, window=(7, 0)), dict(window=(0, 20))]


def _qkv(n, heads, kv_heads, dim, seed=0):
    """q, k, v as the three strided slices of one fused (n, 3, heads, dim) projection (kv: its first kv_heads)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, 3, heads, dim, generator=g).to(torch.bfloat16)
    return qkv[:, 0], qkv[:, 1, :kv_heads], qkv[:, 2, :kv_heads]


def _builds():
    """(name, amx) of each build this machine runs."""
    out = [("avx512", False)]
    if cpu_attention.uses_amx(32):
        out.append(("amx", True))
    return out


def _call(amx: bool, q, k, v, b, **kw):
    """The kernel of one build, called as packed_cpu_attention calls it (with that build's length limit)."""
    head_dim = q.shape[-1]
    lib = ctypes.CDLL(str(cpu_attention._build(head_dim, amx)))
    fn = cpu_attention.cbuild.bind(lib, "poolgate_attend", cpu_attention.SIGNATURES)
    real, real_amx = cpu_attention._kernel, cpu_attention.uses_amx
    cpu_attention._kernel, cpu_attention.uses_amx = (lambda d: fn), (lambda d: amx)
    try:
        return cpu_attention.packed_cpu_attention(q, k, v, b, **kw)
    finally:
        cpu_attention._kernel, cpu_attention.uses_amx = real, real_amx


SHAPES = [(4, 4, 32), (4, 2, 64), (2, 1, 128), (3, 3, 16), (2, 2, 96)]  # heads, kv heads, head dim
# every shape on the AVX512-BF16 build; on the AMX build the head dims it takes (multiples of 32)
BUILD_SHAPES = [(build, amx, *shape) for build, amx in _builds() for shape in SHAPES
                if not (amx and shape[2] % 32)] if REASON is None else []


@needs_kernel
@pytest.mark.parametrize("build,amx,heads,kv_heads,dim", BUILD_SHAPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "full")
def test_kernel_matches_reference(build, amx, heads, kv_heads, dim, case):
    b = pack([[1] * n for n in LENGTHS], group_attention=True)
    q, k, v = _qkv(b.n_tokens, heads, kv_heads, dim)
    kw = dict(scale=dim ** -0.5, **case)
    ref = reference_attention(q.float(), k.float(), v.float(), b, **kw)
    got = _call(amx, q, k, v, b, **kw)
    sdpa = grouped_sdpa(q, k, v, b, **kw)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape and got.is_contiguous()
    err, sdpa_err = (got.float() - ref).abs().max().item(), (sdpa.float() - ref).abs().max().item()
    assert err <= 2 * sdpa_err + 1e-3, (err, sdpa_err)


@needs_kernel
@pytest.mark.parametrize("build,amx", _builds() if REASON is None else [])
@pytest.mark.parametrize("causal", [False, True])
def test_peaked_scores_far_from_the_first_key(build, amx, causal):
    """Scores hundreds of log2 units apart: rows whose best key scores far above their first take the exact
    maximum (no term overflows), the rest shift by the first score; terms far below the best flush to zero.
    Either way each row matches the fp32 reference as closely as SDPA in bf16 does."""
    b = pack([[1] * n for n in LENGTHS], group_attention=True)
    q, k, v = _qkv(b.n_tokens, 4, 4, 32, seed=3)
    q = (q.float() * 30).to(torch.bfloat16)
    kw = dict(scale=32 ** -0.5, causal=causal)
    first = torch.cat([torch.full((e - a,), a) for a, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist())])
    scores = torch.einsum("nhd,mhd->hnm", q.float(), k.float()) * 32 ** -0.5 * 1.4427
    gap = scores.amax(-1) - scores[:, torch.arange(b.n_tokens), first]
    assert (gap > 64).any() and (gap < 64).any()  # rows on both paths
    ref = reference_attention(q.float(), k.float(), v.float(), b, **kw)
    got = _call(amx, q, k, v, b, **kw)
    sdpa = grouped_sdpa(q, k, v, b, **kw)
    assert torch.isfinite(got.float()).all()
    err, sdpa_err = (got.float() - ref).abs().max().item(), (sdpa.float() - ref).abs().max().item()
    assert err <= 2 * sdpa_err + 1e-3, (err, sdpa_err)


@needs_kernel
def test_the_callers_denormals_are_left_as_they_were():
    """The kernel flushes denormals for its own call only: the thread's floating-point state comes back."""
    tiny = torch.tensor([1e-39])
    assert (tiny * 0.5).item() != 0  # denormals on here
    b = pack([[1] * 40], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 2, 2, 32)
    cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2)
    assert (tiny * 0.5).item() != 0


@needs_kernel
def test_long_sequence_and_rows_past_the_last_sequence():
    """A 700-token sequence (many query blocks, scratch sized per call) beside a short one; rows of a padded
    token bucket (past cu_seqlens[-1]) come back zero, never another sequence's output."""
    b = pack([[1] * 700, [1] * 5], group_attention=False)
    q, k, v = _qkv(b.n_tokens + 11, 2, 2, 64)
    got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.125)
    ref = reference_attention(q[:705].float(), k[:705].float(), v[:705].float(), b, scale=0.125)
    assert (got[:705].float() - ref).abs().max().item() < 0.03
    assert torch.count_nonzero(got[705:]) == 0


@needs_kernel
def test_a_team_of_threads_splits_the_batch_and_agrees(monkeypatch):
    b = pack([[1] * n for n in LENGTHS * 6], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 4, 32)
    assert sum(n * n for n in b.lengths) * 4 >= cpu_attention.SPLIT_WORK  # big enough to split
    one = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert len(cpu_attention._splits(b.lengths, 4, 3)) == 3
    assert torch.equal(cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2), one)


@needs_kernel
@pytest.mark.parametrize("cap", [cpu_attention.AVX512_MAX_LEN, None], ids=["capped", "every-length"])
@pytest.mark.parametrize("case", [dict(), dict(causal=True)], ids=["full", "causal"])
def test_the_avx512_builds_length_cap_sends_longer_sequences_to_sdpa(monkeypatch, cap, case):
    """Capped (Intel): the 230-token sequence goes to SDPA and nothing else does; uncapped (AMD): the kernel
    takes it. Either way every token matches the reference."""
    monkeypatch.setattr(cpu_attention, "avx512_max_len", lambda: cap)
    handed: list[int] = []
    real = cpu_attention._long_sequences

    def spy(q, k, v, batch, out, max_len, **kw):
        handed.extend(n for n in batch.lengths if n > max_len)
        return real(q, k, v, batch, out, max_len, **kw)

    monkeypatch.setattr(cpu_attention, "_long_sequences", spy)
    b = pack([[1] * n for n in LENGTHS], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 4, 32)
    ref = reference_attention(q.float(), k.float(), v.float(), b, scale=0.2, **case)
    got = _call(False, q, k, v, b, scale=0.2, **case)
    assert (got.float() - ref).abs().max().item() < 0.03
    assert handed == ([230] if cap else [])


def test_the_avx512_length_cap_follows_the_cpu_vendor(monkeypatch):
    capped = cpu_attention.AVX512_MAX_LEN
    for vendor, cap in (("AuthenticAMD", None), ("GenuineIntel", capped), ("", capped)):
        monkeypatch.setattr(cpu_attention, "cpu_vendor", lambda v=vendor: v)
        assert cpu_attention.avx512_max_len.__wrapped__() == cap


def test_splits_cover_every_item_once_by_cost():
    lengths = [100, 1, 1, 1, 100, 1, 50, 50]
    parts = cpu_attention._splits(lengths, 2, 2)
    items = [i for a, e in parts for i in range(a, e)]
    assert items == list(range(len(lengths) * 2))
    assert all(a % 2 == 0 for a, _ in parts)  # a part never cuts a sequence's heads
    assert cpu_attention._splits([5], 3, 4) == [(0, 3)]


def test_what_the_kernel_does_not_take_goes_where_it_is_exact():
    """A bias, a soft cap or masked keys: grouped SDPA (those batches carry the plan); an fp32 batch or an odd
    head dim without a plan: SDPA per sequence. Each against the fp32 reference."""
    b = pack([[1] * n for n in LENGTHS], group_attention=True)
    q, k, v = _qkv(b.n_tokens, 4, 4, 24)
    with torch.no_grad():
        bias = RelativeBuckets(heads=4, num_buckets=32, max_distance=128).for_length(b.max_len)
    for kw in (dict(bias=bias), dict(softcap=5.0)):
        ref = reference_attention(q.float(), k.float(), v.float(), b, scale=0.2, **kw)
        got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2, **kw)
        assert (got.float() - ref).abs().max().item() < 0.05
    plain = pack([[1] * n for n in LENGTHS], group_attention=False)
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        ref = reference_attention(qd.float(), kd.float(), vd.float(), plain, scale=0.2, causal=True)
        got = cpu_attention.packed_cpu_attention(qd, kd, vd, plain, scale=0.2, causal=True)
        assert got.dtype == dtype and (got.float() - ref).abs().max().item() < 0.05


def test_the_cpu_backend_picks_the_kernel_for_bf16_where_it_runs():
    import subprocess
    import sys

    from poolgate.workers.backends.cpu import CpuBackend

    b = CpuBackend()
    want = grouped_sdpa if REASON else cpu_attention.packed_cpu_attention
    assert b.attention(torch.bfloat16) is want and b.uses_groups(torch.bfloat16) == (REASON is not None)
    f32 = cpu_attention.cpu_attention_f32.unavailable() is None  # fp32: the AVX2 kernel (test_cpu_attention_f32)
    assert b.attention(torch.float32) is (cpu_attention.packed_cpu_attention if f32 else grouped_sdpa)
    assert b.uses_groups(torch.float32) == (not f32)
    code = ("import torch; from poolgate.workers.backends.cpu import CpuBackend; "
            "print(CpuBackend().attention(torch.bfloat16).__name__)")
    env = {**__import__("os").environ, cpu_attention.MODE_ENV: "sdpa"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert out.stdout.strip() == "grouped_sdpa"  # the switch to measure against (docs/benchmarks.md)


def _without_compiler(tmp_path, code, cache):
    import os
    import subprocess
    import sys

    bare = tmp_path / "bin"  # a PATH with python and no cc/gcc
    bare.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(bare), "CC": "", "POOLGATE_KERNEL_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=True).stdout.strip()


@needs_kernel
def test_no_compiler_means_the_torch_paths_and_a_prebuilt_cache_means_none_is_needed(tmp_path):
    code = ("import torch; from poolgate.workers.kernels import cpu_attention as c, fused_norm as f; "
            "from poolgate.workers.backends.cpu import CpuBackend; b = CpuBackend(); "
            "print(c.unavailable(), '|', f.unavailable(), '|', b.attention(torch.bfloat16).__name__, '|', "
            "type(b.ops(torch.bfloat16).layer_norm(16, 1e-5)).__name__)")
    empty = _without_compiler(tmp_path, code, tmp_path / "empty")
    assert empty.count("no C compiler") == 2 and empty.endswith("| grouped_sdpa | LayerNorm"), empty
    import os

    os.environ["POOLGATE_KERNEL_CACHE"] = str(tmp_path / "built")
    try:
        cpu_attention.prebuild([32])
    finally:
        del os.environ["POOLGATE_KERNEL_CACHE"]
    built = _without_compiler(tmp_path, code, tmp_path / "built")
    assert built == "None | None | packed_cpu_attention | FusedLayerNorm", built


@needs_kernel  # on a CPU without AVX512-BF16 bf16 never reaches the C code: nothing to build
def test_a_head_dim_that_does_not_build_runs_sdpa_and_is_not_built_again(monkeypatch):
    calls = []

    def failing(*a, **kw):
        calls.append(a)
        raise RuntimeError("cc failed on packed_attention.c: (a test)")

    monkeypatch.setattr(cpu_attention.cbuild, "load", failing)
    cpu_attention._loaded.cache_clear()
    try:
        b = pack([[1] * n for n in LENGTHS], group_attention=False)
        q, k, v = _qkv(b.n_tokens, 2, 2, 48)
        ref = reference_attention(q.float(), k.float(), v.float(), b, scale=0.2)
        for _ in range(2):
            got = cpu_attention.packed_cpu_attention(q, k, v, b, scale=0.2)
            assert (got.float() - ref).abs().max().item() < 0.05
        assert len(calls) == 1
    finally:
        cpu_attention._loaded.cache_clear()


def test_a_build_is_readable_by_every_user(tmp_path, monkeypatch):
    """An image builds the cache as root and runs as another user: the shared objects are 0644, not mkstemp's 0600."""
    from poolgate.workers.kernels import cbuild, fused_norm

    monkeypatch.setenv("POOLGATE_KERNEL_CACHE", str(tmp_path))
    if cbuild.compiler() is None:
        pytest.skip("no C compiler here")
    path = cbuild.build(fused_norm.SOURCE, ())
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_kernel_is_one_opaque_torch_op_with_a_fake():
    """``poolgate::packed_attention`` traced on fake tensors: one node of the op, the output's shape from its
    fake (no kernel, no compiler needed), and a call it cannot take is refused while tracing, so a compiled
    graph never hands it to the C code."""
    from torch.fx.experimental.proxy_tensor import make_fx

    b = pack([[1] * 5, [1] * 3], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 2, 32)

    def attend(q, k, v, cu):
        return cpu_attention.ATTEND(q, k, v, cu, 0.2, False, -1, -1, 5, [0, 8])

    graph = make_fx(attend, tracing_mode="fake")(q, k, v, b.cu_seqlens.to(torch.int32))
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.poolgate.packed_attention.default], calls
    (out,) = [n for n in graph.graph.nodes if n.target == torch.ops.poolgate.packed_attention.default]
    assert tuple(out.meta["val"].shape) == (8, 4, 32)
    with pytest.raises(ValueError, match="poolgate::packed_attention takes"):
        make_fx(attend, tracing_mode="fake")(q.float(), k.float(), v.float(), b.cu_seqlens.to(torch.int32))
    with pytest.raises(ValueError, match="poolgate::packed_attention takes"):
        make_fx(attend, tracing_mode="fake")(q, k, v, b.cu_seqlens.to(torch.int64))


@needs_kernel
def test_torch_compile_runs_the_op_whole_and_agrees_with_eager():
    b = pack([[1] * n for n in LENGTHS], group_attention=False)
    q, k, v = _qkv(b.n_tokens, 4, 4, 32)
    cu = b.cu_seqlens.to(torch.int32)
    items = [0, (len(LENGTHS) - 1) * 4]  # the last sequence's items are left to SDPA: its rows are not compared

    def attend(q, k, v, cu):
        return cpu_attention.ATTEND(q, k, v, cu, 0.2, True, -1, -1, b.max_len, items) * 2

    eager = attend(q, k, v, cu)
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v, cu)
    rows = int(cu[-2])
    assert torch.equal(compiled[:rows], eager[:rows])
    ref = reference_attention(q.float(), k.float(), v.float(), b, scale=0.2, causal=True)
    assert (eager[:rows].float() / 2 - ref[:rows]).abs().max().item() < 0.03
