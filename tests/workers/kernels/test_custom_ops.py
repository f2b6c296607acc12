"""``custom_ops.KernelOp``: plain eager calls run the kernel function, anything that watches goes through the op.

Spies stand in for the op and the kernel (no C kernel needed), and each watcher is shown to take the op:
the profiler, fake tensors, a dispatch mode, a function mode, ``torch.jit.trace`` and ``torch.compile``. On a
machine where the C kernels run, the profiler names both ``poolgate::`` ops in a real forward's calls.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from poolgate.workers.kernels import cpu_attention, custom_ops, fused_norm


class PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _spied():
    took: list[str] = []

    def op(x):
        took.append("op")
        return x + 1

    def kernel(x):
        took.append("kernel")
        return x - 1

    return custom_ops.KernelOp(op, kernel), took


def test_plain_eager_runs_the_kernel_function():
    kop, took = _spied()
    with torch.inference_mode():
        assert kop(torch.zeros(2)).tolist() == [-1, -1]
    assert kop(torch.zeros(2)).tolist() == [-1, -1]
    assert took == ["kernel", "kernel"]


@pytest.mark.parametrize("watcher", ["profiler", "fake tensors", "dispatch mode", "function mode"])
def test_a_watched_call_goes_through_the_op(watcher):
    kop, took = _spied()
    x = torch.zeros(2)
    if watcher == "profiler":
        with torch.profiler.profile():
            kop(x)
    elif watcher == "fake tensors":
        with FakeTensorMode() as mode:
            kop(mode.from_tensor(x))
    elif watcher == "dispatch mode":
        with FlopCounterMode(display=False):
            kop(x)
    else:
        with PassThrough():
            kop(x)
    assert took == ["op"]
    kop(x)
    assert took == ["op", "kernel"]  # the watcher gone, the kernel again


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_jit_trace_and_torch_compile_record_the_op():
    kop, took = _spied()
    traced = torch.jit.trace(lambda x: kop(x) * 2, (torch.zeros(2),), check_trace=False)
    assert took == ["op"] and traced(torch.ones(2)).tolist() == [4, 4]
    took.clear()
    compiled = torch.compile(lambda x: kop(x) * 2, backend="eager", fullgraph=True)
    assert compiled(torch.ones(2)).tolist() == [4, 4] and took == ["op"]


@pytest.mark.skipif(cpu_attention.unavailable() is not None or fused_norm.unavailable() is not None,
                    reason=f"the kernels do not run here: {cpu_attention.unavailable() or fused_norm.unavailable()}")
def test_the_profiler_names_both_kernels_in_a_forward(tmp_path):
    from transformers import AutoModel, BertConfig

    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.backends.cpu import CpuBackend
    from poolgate.workers.batch.packing import pack
    from poolgate.workers.load.st_config import read_spec
    from poolgate.workers.models import build_model
    from tests.fakes import save_random

    save_random(tmp_path, AutoModel, BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64,
                                                max_position_embeddings=64, pad_token_id=0))  # head dim 16
    model, _ = build_model(read_spec(WorkerConfig(model=str(tmp_path), served_model_name="m")),
                           CpuBackend().ops(torch.bfloat16), allow_pickle=False)
    with torch.inference_mode(), torch.profiler.profile() as prof:
        model.to(torch.bfloat16)(pack([[5, 6, 7], [8, 9]], group_attention=False))
    names = {e.name for e in prof.events()}
    assert {"poolgate::packed_attention", "poolgate::add_layer_norm"} <= names, sorted(names)
