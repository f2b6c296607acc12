"""Residual add + LayerNorm in one pass over bf16 rows on x86 CPUs with AVX512-BF16 (``fused_norm.c``).

``FusedLayerNorm`` is the ops bundle's ``LayerNorm`` (``norm(x, residual)`` =
``norm(x + residual)``) with the C kernel under it for 2-D bf16 rows whose
width is a multiple of 16: the sum rounded to bf16 as the reference's add
leaves it, fp32 statistics and affine, one read of each input and one write.
Anything else (another dtype, other shapes or strides, no kernel on this
machine) runs the reference. Measured here (4,096 x 384 bf16, one thread):
0.64 ms against 1.28 ms for torch's add then LayerNorm, the same to the bit
for all but about 2 in 100,000 elements (those one bf16 step apart).
``overwrite_x=True`` (the caller's leave, see ``norm.LayerNorm``) writes the
result over ``x``: in the bundled model's forward, with the kernel's row
prefetch, 1.6 ms a call of 8,192 rows against 2.3 before either.
The kernel is the ``torch.library`` op ``poolgate::add_layer_norm``
(``workers.kernels.custom_ops``), which writes into its ``out``; its shared
object is built ahead (``poolgate build-kernels``) or when the CPU backend
picks its ops at model load (``unavailable``), never inside a request.
"""
from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from poolgate.shared.config.cpu import cpu_flags
from poolgate.workers.kernels import cbuild, custom_ops
from poolgate.workers.kernels.norm import AddInPlaceLayerNorm, LayerNorm

SOURCE = Path(__file__).with_name("fused_norm.c")
MAX_DIM = 16384  # fused_norm.c's row buffer
SPLIT_ROWS = 1024  # a team of threads splits the rows only from here (starting threads costs ~0.1 ms)
# fused_norm.c's exported function, as cbuild.bind types it
SIGNATURES: dict[str, cbuild.Signature] = {
    "poolgate_add_layer_norm": (ctypes.c_int, (ctypes.c_void_p,) * 5 + (ctypes.c_int64,) * 4 + (ctypes.c_float,)
                                + (ctypes.c_int64,) * 2),
}


@cache
def _kernel():
    return cbuild.bind(cbuild.load(SOURCE, ()), "poolgate_add_layer_norm", SIGNATURES)


@cache
def unavailable() -> str | None:
    """Why the kernel cannot run here, or None (the CPU's flags, a build)."""
    missing = cbuild.AVX512_BF16_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    try:
        _kernel()
    except (OSError, RuntimeError) as exc:
        return f"the kernel did not build: {exc}"
    return None


def _rows(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and t.is_cpu and t.dim() == 2 and t.stride(1) == 1


def _affine_vector(t: torch.Tensor, dim: int) -> bool:
    return t.dtype == torch.float32 and t.is_cpu and t.shape == (dim,) and t.is_contiguous()


def _add_layer_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                    eps: float, out: torch.Tensor, bounds: list[int]) -> None:
    """``poolgate::add_layer_norm`` on CPU tensors: ``out = layer_norm(x + residual)`` over (rows, dim) bf16 rows
    with fp32 ``weight`` and ``bias``, rows ``bounds[i]:bounds[i+1]`` each on a thread of its own (``out`` may
    be ``x``: each row is read whole before it is written). It trusts its eager caller (``FusedLayerNorm``
    checks what it hands on): a check here would cost ~2.8 µs a call; under tracing the fake checks it."""
    dim = x.shape[1]
    args = (x.data_ptr(), 0 if residual is None else residual.data_ptr(), out.data_ptr(), weight.data_ptr(),
            0 if bias is None else bias.data_ptr(), dim, x.stride(0), 0 if residual is None else residual.stride(0),
            out.stride(0), eps)
    if any(cbuild.run_split(_kernel(), args, list(zip(bounds[:-1], bounds[1:], strict=True)))):
        raise RuntimeError(f"the fused LayerNorm kernel refused rows of {dim}")


def _add_layer_norm_fake(x, residual, weight, bias, eps, out, bounds) -> None:
    """Nothing to make under tracing (``out`` is written), once the inputs are what the kernel takes (ValueError
    else: a compiled graph never hands the C code another layout)."""
    dim = x.shape[-1]
    if not (_rows(x) and _rows(out) and out.shape == x.shape and (residual is None or (
            _rows(residual) and residual.shape == x.shape)) and _affine_vector(weight, dim)
            and (bias is None or _affine_vector(bias, dim)) and dim % 16 == 0 and dim <= MAX_DIM):
        raise ValueError("poolgate::add_layer_norm takes 2-D bf16 rows of a multiple of 16 (at most "
                         f"{MAX_DIM}) and contiguous fp32 weights as wide")


ADD_LAYER_NORM = custom_ops.define("add_layer_norm(Tensor x, Tensor? residual, Tensor weight, Tensor? bias, "
                                   "float eps, Tensor(a!) out, int[] bounds) -> ()", _add_layer_norm,
                                   _add_layer_norm_fake)


class FusedLayerNorm(AddInPlaceLayerNorm):
    """``LayerNorm`` on the C kernel where it applies (see the module docstring); fp32 rows add the residual
    in place (``AddInPlaceLayerNorm``)."""

    def _affine(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 copies of the weight and bias, made again whenever either changes (a load, a cast)."""
        key = tuple((t.data_ptr(), t.dtype, t._version) if t is not None else None for t in (self.weight, self.bias))
        cached = getattr(self, "_fp32", None)
        if cached is None or cached[0] != key:
            b = None if self.bias is None else self.bias.detach().float().contiguous()
            self._fp32 = (key, self.weight.detach().float().contiguous(), b)
        return self._fp32[1], self._fp32[2]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                overwrite_x: bool = False) -> torch.Tensor:
        dim = x.shape[-1]
        if not (_rows(x) and (residual is None or (_rows(residual) and residual.shape == x.shape))
                and dim % 16 == 0 and dim <= MAX_DIM and self.weight is not None
                and tuple(self.normalized_shape) == (dim,) and unavailable() is None):
            return super().forward(x, residual, overwrite_x=overwrite_x)
        w, b = self._affine()
        # over x where the caller allows it and x's rows are its own (not a broadcast): each row is read whole
        # before it is written, and a fresh buffer's lines need not be fetched to be written
        out = x if overwrite_x and x.stride(0) >= dim else torch.empty(x.shape, dtype=x.dtype)
        n = x.shape[0]
        threads = torch.get_num_threads() if n >= SPLIT_ROWS else 1  # a thread costs more than a few rows
        ADD_LAYER_NORM(x, residual, w, b, float(self.eps), out, [n * i // threads for i in range(threads + 1)])
        return out  # (rows, dim)


def fused_layer_norm(dim: int, eps: float, bias: bool = True) -> LayerNorm:
    return FusedLayerNorm(dim, eps=eps, bias=bias)
