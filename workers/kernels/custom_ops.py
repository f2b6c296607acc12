"""poolgate's C kernels as ``torch.library`` ops in one ``poolgate::`` namespace: schema, CPU kernel and fake.

Each C kernel's Python wrapper (``cpu_attention``, ``fused_norm``) calls its
kernel through the ``KernelOp`` that ``define`` returns, so ``torch.compile``,
``make_fx`` and ``torch.jit`` tracing, dispatch modes and the profiler see one
opaque ``poolgate::<name>`` call with the shapes its fake gives, never the
ctypes call inside. A kernel trusts its eager caller (the wrapper checks what
it hands on); its fake checks the same under tracing, so a compiled graph
never hands the C code another layout.

Where nothing watches (plain eager tensors; no compiler, tracer, mode or
profiler), ``KernelOp`` calls the kernel function itself, the one the
dispatcher would call. Measured inside the bundled model's bf16 forwards (6
attention and 13 LayerNorm calls, one thread): through the dispatcher each
call cost 7-10 µs more at 8-64 tokens and ~15 at 1,024 (the dispatcher's path
runs cold between the GEMMs; 3 µs in a tight loop), 4-5% of a forward of
8-64 tokens, 1% at 1,024; ``KernelOp``'s check costs 1-3 µs there (0.2 in a
tight loop), and whole forwards stay within the noise (~2%) of the ctypes
calls before the ops. The ops are registered with ``torch.library.Library``
(``define`` + ``impl`` + ``register_fake``) rather than
``torch.library.custom_op``, whose Python layer cost 6 µs more a call than a
plain call for the attention's schema and 19 µs for the LayerNorm's (its
``out`` mutated) in a tight loop, against 4 and 2.5 µs this way.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "poolgate"
LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


# bound once: each call reads them cold between a forward's GEMMs, where every attribute lookup counts
_compiling, _Tensor, _dispatch_modes = torch.compiler.is_compiling, torch.Tensor, torch._C._len_torch_dispatch_stack
_function_modes, _jit_tracing, _profiling = (torch._C._is_torch_function_mode_enabled, torch._C._is_tracing,
                                             torch.autograd._profiler_enabled)


class KernelOp:
    """One registered kernel, called as its schema says: through the dispatcher (``op``) when something
    watches the call, else straight to ``kernel``, the function the dispatcher would call. Watching:
    ``torch.compile`` (dynamo), a tensor subclass as the first argument (fake and functional tensors), a
    dispatch or function mode (``make_fx``, ``FlopCounterMode``), ``torch.jit.trace``, the profiler."""

    def __init__(self, op: torch._ops.OpOverload, kernel: Callable) -> None:
        self.op, self.kernel = op, kernel

    def __call__(self, *args):
        if (_compiling() or type(args[0]) is not _Tensor or _dispatch_modes() or _function_modes() or _jit_tracing()
                or _profiling()):  # dynamo folds the first to True and traces the op; the rest run in eager only
            return self.op(*args)
        return self.kernel(*args)


def define(schema: str, kernel: Callable, fake: Callable) -> KernelOp:
    """Register ``schema`` (``"name(Tensor x, ...) -> ..."``) with ``kernel`` for CPU tensors and ``fake`` for
    tracing (shapes only, and the inputs' checks); the op (``torch.ops.poolgate.<name>.default``) as a
    ``KernelOp``."""
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    LIBRARY.impl(name, kernel, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)
    return KernelOp(getattr(getattr(torch.ops, NAMESPACE), name).default, kernel)
