"""Position schemes, one place each: learned absolute, MPNet's relative bias buckets, RoPE.

All work on packed batches: ``batch.positions`` counts from 0 within each
sequence, and each scheme turns that into what its family needs.

- ``LearnedPositions``: an embedding table read at ``position + offset``;
  ``learned_offset`` is RoBERTa's ``padding_idx + 1`` rule (RoBERTa, XLM-R,
  CamemBERT, MPNet number real tokens from the pad id + 1), written once.
- ``RelativeBuckets``: MPNet's bidirectional log-bucketed relative position
  bias, shared by every layer; ``for_length`` gives the ``RelativeBias`` the
  attention contract takes.
- ``Rope``: rotary embeddings from the config's ``rope_theta`` and scaling
  (default, linear, llama3, yarn, and the GTE Hub code's fixed or mixed ``ntk``),
  ``partial_rotary_factor`` and head_dim;
  the ops bundle's ``rope`` (its torch reference: ``apply_rope``) applies them to packed
  q/k in the "rotate halves" layout transformers uses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

PAD_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet", "data2vec-text", "xmod"})
FIXED_PAD_IDX = {"mpnet": 1}  # MPNet's embeddings use padding_idx 1 whatever the config says


def learned_offset(hf: dict) -> int:
    """How far a family's learned position table is shifted: ``padding_idx + 1`` for RoBERTa-likes, else 0."""
    kind = hf.get("model_type", "bert")
    if kind not in PAD_OFFSET_TYPES:
        return 0
    pad = FIXED_PAD_IDX.get(kind, hf.get("pad_token_id"))
    return int(1 if pad is None else pad) + 1


class LearnedPositions(nn.Embedding):
    """(n_tokens,) positions → (n_tokens, hidden) rows of the table at ``position + offset``."""

    def __init__(self, max_positions: int, hidden: int, offset: int = 0):
        super().__init__(max_positions, hidden)
        self.offset = offset

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(positions + self.offset if self.offset else positions)


def relative_bucket(relative: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bidirectional buckets of ``relative = key - query``: exact for small distances, log-spaced to
    ``max_distance``; the two directions use separate halves of the buckets."""
    half = num_buckets // 2
    bucket = (relative > 0).long() * half  # keys after the query: upper half
    n = relative.abs()
    exact = half // 2
    far = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).long()
    return bucket + torch.where(n < exact, n, far.clamp(max=half - 1))


class FixedBias:
    """A ``RelativeBias`` over a precomputed (heads, L, L) block, sliced for shorter sequences."""

    def __init__(self, full: torch.Tensor):
        self.full = full

    def block(self, length: int) -> torch.Tensor:
        return self.full[:, :length, :length]


class RelativeBuckets(nn.Module):
    """MPNet's relative position bias: one (table_size, heads) table shared by all layers.

    transformers' MPNet sizes the table by ``relative_attention_num_buckets``
    but always buckets into 32, so the two are separate here.
    """

    def __init__(self, heads: int, num_buckets: int = 32, max_distance: int = 128, table_size: int | None = None):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Embedding(table_size or num_buckets, heads)

    def for_length(self, length: int) -> FixedBias:
        """The bias for sequences up to ``length`` tokens (one computation per forward)."""
        pos = torch.arange(length, device=self.table.weight.device)
        buckets = relative_bucket(pos[None, :] - pos[:, None], self.num_buckets, self.max_distance)  # (L, L)
        return FixedBias(self.table(buckets).permute(2, 0, 1))  # (heads, L, L)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary settings read from a Hugging Face config (old ``rope_theta``/``rope_scaling`` keys or
    transformers 5's ``rope_parameters``, optionally per layer type as Gemma 3 has them)."""

    head_dim: int
    rotary_dim: int
    theta: float
    scaling: tuple[tuple[str, object], ...] = ()  # sorted items of the scaling dict; () = none

    @classmethod
    def from_hf(cls, hf: dict, head_dim: int, layer_type: str | None = None) -> "RopeConfig":
        params = dict(hf.get("rope_parameters") or {})
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params = dict(params[layer_type])
        scaling = dict(hf.get("rope_scaling") or {})
        scaling.update(params)
        theta = float(scaling.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        kind = scaling.pop("rope_type", scaling.pop("type", "default"))
        factor = float(scaling.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
        if kind not in ROPE_TYPES:
            raise ValueError(f"rope scaling type {kind!r} is not supported (known: {', '.join(ROPE_TYPES)})")
        items = () if kind == "default" else tuple(sorted({**scaling, "rope_type": kind}.items()))
        if kind == "yarn":
            items = tuple(sorted({**dict(items), "max_position_embeddings": hf.get("max_position_embeddings")}.items()))
        return cls(head_dim=head_dim, rotary_dim=int(head_dim * factor), theta=theta, scaling=items)

    def inv_freq(self) -> tuple[torch.Tensor, float]:
        """(rotary_dim // 2,) fp32 inverse frequencies, and the factor cos/sin are scaled by."""
        base = 1.0 / (self.theta ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim))
        s = dict(self.scaling)
        inv, attn = ROPE_TYPES[s.get("rope_type", "default")](base, s, self)
        return inv.float(), attn


def _default(inv: torch.Tensor, s: dict, c: RopeConfig) -> tuple[torch.Tensor, float]:
    return inv, 1.0


def _linear(inv: torch.Tensor, s: dict, c: RopeConfig) -> tuple[torch.Tensor, float]:
    return inv / float(s["factor"]), 1.0


def _llama3(inv: torch.Tensor, s: dict, c: RopeConfig) -> tuple[torch.Tensor, float]:
    """Long wavelengths divided by ``factor``, short ones kept, a smooth blend between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)  # 0 = long (scaled), 1 = short (kept)
    return (1 - smooth) * inv / factor + smooth * inv, 1.0


def _yarn(inv: torch.Tensor, s: dict, c: RopeConfig) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; cos/sin scaled."""
    factor = float(s["factor"])
    old = float(s.get("original_max_position_embeddings") or s["max_position_embeddings"])
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)
    attn = s.get("attention_factor")
    if attn is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        get = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0  # noqa: E731
        attn = get(mscale) / get(mscale_all) if mscale and mscale_all else get(1.0)
    dim = c.rotary_dim

    def correction(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(c.theta))

    lo, hi = correction(beta_fast), correction(beta_slow)
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    extrapolate = 1 - ramp
    return inv / factor * (1 - extrapolate) + inv * extrapolate, float(attn)


def _ntk(inv: torch.Tensor, s: dict, c: RopeConfig) -> tuple[torch.Tensor, float]:
    """NTK scaling as the GTE Hub code (``NTKScalingRotaryEmbedding``) and vLLM's ``ntk`` compute it, for any
    ``factor > 1``: fixed, ``theta * factor`` and every frequency over ``factor ** (2 / dim)``; mixed (``mixed_b``),
    frequency ``m = 1 .. dim / 2`` over ``exp(a * m ** b)`` with ``a = ln(factor) / (dim / 2) ** b``."""
    factor, dim, b = float(s["factor"]), c.rotary_dim, s.get("mixed_b")
    if factor <= 1:
        return inv, 1.0
    if b is None:
        exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        return 1.0 / (c.theta * factor) ** exponents / factor ** (2 / dim), 1.0
    a = math.log(factor) / (dim / 2) ** float(b)
    return inv / torch.exp(a * torch.arange(1, dim // 2 + 1, dtype=torch.float32) ** float(b)), 1.0


ROPE_TYPES = {"default": _default, "linear": _linear, "llama3": _llama3, "yarn": _yarn, "ntk": _ntk}


class Rope(nn.Module):
    """Rotary embedding for packed q/k; ``cos_sin`` once per forward, ``apply`` per layer."""

    def __init__(self, config: RopeConfig):
        super().__init__()
        self.config = config
        self._inv, self._scale = config.inv_freq()  # fp32, kept out of the state dict and of .to(dtype)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n_tokens,) positions → cos, sin, each (n_tokens, 1, rotary_dim) fp32."""
        if self._inv.device != positions.device:  # moved once, not copied to the device on every forward
            self._inv = self._inv.to(positions.device)
        freqs = positions.float()[:, None] * self._inv[None, :]  # (n_tokens, rotary_dim // 2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # (n_tokens, 1, rotary_dim)
        return emb.cos() * self._scale, emb.sin() * self._scale
