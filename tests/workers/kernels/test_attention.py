"""The attention contract: grouped SDPA and the varlen call against a naive per-sequence reference.

Mixed lengths, causal masks, sliding windows, grouped-query heads, a
relative-position bias and soft-capped logits, each checked token by token against attention
written out plainly (one sequence at a time, masks from explicit (i, j) rules).
"""
import pytest
import torch

from poolgate.workers.kernels.attention import grouped_sdpa, reference_attention, varlen_flash
from poolgate.workers.models.positions import RelativeBuckets
from poolgate.workers.batch.packing import map_tensors, pack, to_device

LENGTHS = [5, 1, 17, 3, 40, 9, 2, 30, 33, 1, 12]


def _batch(waste=1.1, max_group=32, group_attention=True, group_tokens=8192):
    return pack([[7] * n for n in LENGTHS], waste=waste, max_group=max_group, group_attention=group_attention,
                group_tokens=group_tokens)


def _qkv(b, heads=4, kv_heads=4, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b.n_tokens, heads, dim, generator=g), torch.randn(b.n_tokens, kv_heads, dim, generator=g),
            torch.randn(b.n_tokens, kv_heads, dim, generator=g))


def _naive(q, k, v, b, *, scale, causal=False, window=None, bias=None, softcap=None):
    """Token i of a sequence sees key j of the same sequence iff the contract's rules allow it."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for s, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist()):
        n = e - s
        ok = torch.tensor([[(not causal or j <= i) and (window is None or i - window[0] <= j <= i + window[1])
                            for j in range(n)] for i in range(n)])
        extra = bias.block(n) if bias is not None else torch.zeros(1, n, n)
        for h in range(q.shape[1]):
            kh = h // group
            scores = q[s:e, h] @ k[s:e, kh].T * scale  # (n, n)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            scores = scores + extra[h % extra.shape[0]]
            out[s:e, h] = scores.masked_fill(~ok, float("-inf")).softmax(-1) @ v[s:e, kh]
    return out


CASES = [
    dict(),
    dict(causal=True),
    dict(window=(4, 4)),
    dict(window=(0, 2)),
    dict(causal=True, window=(3, 0)),
    dict(causal=True, window=(5, 5)),  # causal wins on the right
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "full")
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_grouped_sdpa_matches_naive(case, heads, kv_heads):
    b = _batch()
    q, k, v = _qkv(b, heads, kv_heads)
    want = _naive(q, k, v, b, scale=0.3, **case)
    torch.testing.assert_close(grouped_sdpa(q, k, v, b, scale=0.3, **case), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reference_attention(q, k, v, b, scale=0.3, **case), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("waste,max_group,group_tokens", [(1.0, 1, 8192), (1.5, 4, 8192), (100.0, 64, 8192),
                                                          (100.0, 64, 64)])
def test_group_plans_do_not_change_the_result(waste, max_group, group_tokens):
    b = _batch(waste, max_group, group_tokens=group_tokens)
    assert all(g.n <= max_group and (g.n == 1 or g.n * g.max_len <= group_tokens) for g in b.groups)
    q, k, v = _qkv(b, 4, 2)
    for case in CASES:
        torch.testing.assert_close(grouped_sdpa(q, k, v, b, scale=0.3, **case),
                                   _naive(q, k, v, b, scale=0.3, **case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [dict(), dict(causal=True), dict(window=(3, 3))], ids=["full", "causal", "window"])
def test_relative_bias(case):
    torch.manual_seed(0)
    b = _batch()
    q, k, v = _qkv(b, 4, 4)
    bias = RelativeBuckets(heads=4, num_buckets=32, max_distance=128)
    with torch.no_grad():
        full = bias.for_length(b.max_len)
        got = grouped_sdpa(q, k, v, b, scale=0.3, bias=full, **case)
        want = _naive(q, k, v, b, scale=0.3, bias=full, **case)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_masks_are_cached_per_kind_and_never_mixed():
    b = _batch()
    q, k, v = _qkv(b)
    first = grouped_sdpa(q, k, v, b, scale=0.3, causal=True)
    grouped_sdpa(q, k, v, b, scale=0.3, window=(2, 2))
    again = grouped_sdpa(q, k, v, b, scale=0.3, causal=True)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert all(len(g.masks) <= 2 for g in b.groups)


def test_windows_on_padded_groups_give_no_nan():
    b = pack([[1] * 50, [1] * 3, [1] * 1], waste=100.0)  # one group, heavy padding
    q, k, v = _qkv(b)
    out = grouped_sdpa(q, k, v, b, scale=0.3, causal=True, window=(1, 0))
    assert torch.isfinite(out).all()


def test_attention_never_plans_groups_itself():
    """The group plan is host work made at packing (the runner's prepare); a batch without it is refused."""
    b = _batch(group_attention=False)
    q, k, v = _qkv(b)
    with pytest.raises(RuntimeError, match="group plan"):
        grouped_sdpa(q, k, v, b, scale=0.3, causal=True)
    assert b.groups is None


@pytest.mark.parametrize("case", [dict(), dict(causal=True), dict(causal=True, window=(3, 0))],
                         ids=["full", "causal", "causal-window"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_softcap_matches_naive(case, heads, kv_heads):
    b = _batch(waste=1.5)
    q, k, v = (t * 3 for t in _qkv(b, heads, kv_heads))  # large logits, so the cap matters
    want = _naive(q, k, v, b, scale=0.3, softcap=2.0, **case)
    got = grouped_sdpa(q, k, v, b, scale=0.3, softcap=2.0, **case)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reference_attention(q, k, v, b, scale=0.3, softcap=2.0, **case), want,
                               atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, grouped_sdpa(q, k, v, b, scale=0.3, **case), atol=1e-3)


def _flash_semantics(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False,
                     **_):
    """What the flash kernel computes per its documentation: window (left, right), -1 = unbounded."""
    assert enable_gqa == (k.shape[1] != q.shape[1]) and cu_q is cu_k
    left, right = window_size
    b = pack([[0] * (e - s) for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist())], group_attention=False)
    big = 10 ** 6
    window = (big if left < 0 else left, big if right < 0 else right)
    return _naive(q, k, v, b, scale=scale, window=window)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "full")
def test_varlen_call_translates_the_contract(monkeypatch, case):
    """The CPU cannot run the flash kernel; this checks the arguments poolgate gives it mean the contract."""
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", _flash_semantics)
    b = _batch(group_attention=False)
    q, k, v = _qkv(b, 4, 2)
    torch.testing.assert_close(varlen_flash(q, k, v, b, scale=0.3, **case), _naive(q, k, v, b, scale=0.3, **case),
                               atol=1e-5, rtol=1e-5)


def test_varlen_with_a_bias_or_a_softcap_uses_grouped_sdpa(monkeypatch):
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", lambda *a, **k: pytest.fail("flash cannot add a bias or cap"))
    b = _batch()  # such a model needs_groups: the runner plans them in prepare on every backend
    q, k, v = _qkv(b)
    bias = RelativeBuckets(heads=4)
    with torch.no_grad():
        full = bias.for_length(b.max_len)
        torch.testing.assert_close(varlen_flash(q, k, v, b, scale=0.3, bias=full),
                                   _naive(q, k, v, b, scale=0.3, bias=full), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(varlen_flash(q, k, v, b, scale=0.3, softcap=1.5, causal=True),
                               _naive(q, k, v, b, scale=0.3, softcap=1.5, causal=True), atol=1e-5, rtol=1e-5)


def test_backends_hand_out_the_contract():
    from poolgate.workers.backends.cpu import CpuBackend
    from poolgate.workers.backends.cuda import CudaBackend, RocmBackend
    from poolgate.workers.backends.xpu import XpuBackend

    from poolgate.workers.kernels import cpu_attention, cpu_attention_f32

    packed = cpu_attention_f32.unavailable() is None  # fp32 on an AVX2 CPU: the packed kernel (test_cpu_attention_f32)
    assert CpuBackend().attention(torch.float32) is (cpu_attention.packed_cpu_attention if packed else grouped_sdpa)
    assert CpuBackend().attention(torch.float16) is grouped_sdpa
    assert RocmBackend().attention(torch.float16) is grouped_sdpa
    assert XpuBackend().attention(torch.bfloat16) is grouped_sdpa
    assert CudaBackend().attention(torch.float32) is grouped_sdpa
    # half precision on CUDA depends on the GPU's generation: tests/workers/test_backends.py


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "full")
def test_varlen_flash_on_gpu(case):
    b = _batch(group_attention=False)
    q, k, v = (t.cuda().half() for t in _qkv(b, 8, 2, dim=64))
    gpu = to_device(pack([[7] * n for n in LENGTHS], group_attention=False), torch.device("cuda"))
    got = varlen_flash(q, k, v, gpu, scale=0.125, **case).float().cpu()
    want = reference_attention(*(t.float().cpu() for t in (q, k, v)), b, scale=0.125, **case)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    grouped = grouped_sdpa(q, k, v, gpu, scale=0.125, **case).float().cpu()
    torch.testing.assert_close(grouped, want, atol=2e-3, rtol=2e-3)


def test_fused_qkv_views_are_gathered_once_and_exactly():
    from poolgate.workers.kernels.attention import _fused

    b = _batch()
    qkv = torch.randn(b.n_tokens, 3 * 4 * 8).view(b.n_tokens, 3, 4, 8)
    q, k, v = qkv.unbind(1)
    view = _fused(q, k, v)
    assert view is not None and torch.equal(view, qkv)
    assert _fused(k, q, v) is None and _fused(q.clone(), k, v) is None and _fused(*_qkv(b)) is None
    assert _fused(q, k[:, :2], v[:, :2]) is None  # GQA
    for case in CASES:
        got = grouped_sdpa(q, k, v, b, scale=0.3, **case)
        torch.testing.assert_close(got, _naive(q, k, v, b, scale=0.3, **case), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, grouped_sdpa(q.clone(), k.clone(), v.clone(), b, scale=0.3, **case),
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", [dict(), dict(window=(4, 4))], ids=["full", "window"])
def test_masked_keys_are_attended_by_no_token(case):
    """pack(attend=...): a False token is a key no query attends (itself included), as a padded batch's
    attention_mask 0, yet its own row is computed; the batch goes through the groups even where varlen would."""
    lengths = [6, 9, 1, 12]
    attend = [[True] * 3 + [False] * 3, None, [True], [True] * 8 + [False] * 4]
    b = map_tensors(pack([[7] * n for n in lengths], attend=attend, group_attention=False), torch.clone)  # as uploaded
    assert b.key_masked and b.groups is not None
    q, k, v = _qkv(b)
    got = grouped_sdpa(q, k, v, b, scale=0.3, **case)
    keys = torch.tensor([x for a, n in zip(attend, lengths) for x in (a if a is not None else [True] * n)])
    for s, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist()):
        n = e - s
        ok = torch.tensor([[bool(keys[s + j]) and (not case or i - 4 <= j <= i + 4) for j in range(n)]
                           for i in range(n)])
        for h in range(q.shape[1]):
            want = (q[s:e, h] @ k[s:e, h].T * 0.3).masked_fill(~ok, float("-inf")).softmax(-1) @ v[s:e, h]
            torch.testing.assert_close(got[s:e, h], want, atol=1e-5, rtol=1e-5)
