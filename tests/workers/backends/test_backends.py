"""workers.backends: detection (ROCm and XPU through monkeypatched torch), device reports, CPU pinning."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from types import SimpleNamespace

import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.backends import BACKENDS, get_backend
from poolgate.workers.backends.cpu import CpuBackend, cpu_class, cpu_model
from poolgate.workers.backends.cuda import CudaBackend, RocmBackend
from poolgate.workers.backends.xpu import XpuBackend
from poolgate.workers.kernels.attention import grouped_sdpa
from poolgate.workers.kernels.gpu.ops import triton_kernels

SDPA_LINE = "grouped_sdpa (torch SDPA per group of similar lengths)"  # the GPU backends' kernels report

GIB = 1 << 30


def fake_gpu(monkeypatch, *, hip: str | None, capability: tuple[int, int] = (9, 0)):
    """torch.cuda as a GPU box would show it: a ROCm build sets torch.version.hip."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "AMD Instinct MI300X" if hip else "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 4 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(total_memory=141 * GIB))


def fake_xpu(monkeypatch, available: bool = True):
    xpu = SimpleNamespace(
        is_available=lambda: available, current_device=lambda: 0,
        get_device_name=lambda d=None: "Intel Data Center GPU Max 1550",
        memory_allocated=lambda d=None: GIB, memory_reserved=lambda d=None: 2 * GIB,
        get_device_properties=lambda d=None: SimpleNamespace(total_memory=64 * GIB),
        synchronize=lambda: None, empty_cache=lambda: None)
    monkeypatch.setattr(torch, "xpu", xpu, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_registry_has_every_backend():
    assert set(BACKENDS) == {"cuda", "rocm", "xpu", "cpu"}
    assert all(cls.name == name for name, cls in BACKENDS.items())


def test_rocm_is_detected_from_the_torch_build(monkeypatch):
    fake_gpu(monkeypatch, hip="6.2.41133")
    assert isinstance(get_backend("auto"), RocmBackend)
    assert not CudaBackend().available()
    with pytest.raises(RuntimeError, match="not available"):
        get_backend("cuda")
    report = get_backend("rocm").report(torch.float16, device="2")
    assert report == {"device": "rocm:2", "device_name": "AMD Instinct MI300X", "attention": "grouped_sdpa",
                      "device_memory": {"allocated": 3 * GIB, "reserved": 4 * GIB, "total": 141 * GIB},
                      "kernels": {"attention": SDPA_LINE, **triton_kernels(torch.float16)}}


def test_cuda_is_detected_when_the_build_is_not_hip(monkeypatch):
    fake_gpu(monkeypatch, hip=None)
    backend = get_backend("auto")
    assert type(backend) is CudaBackend and not RocmBackend().available()
    report = backend.report(torch.float32)
    assert report["device"] == "cuda:0" and report["device_name"] == "NVIDIA H200"
    assert report["attention"] == "grouped_sdpa"  # fp32 never takes the half-precision flash path
    assert report["device_memory"]["total"] == 141 * GIB


def test_xpu_is_detected_through_torch_xpu(monkeypatch):
    fake_xpu(monkeypatch)
    backend = get_backend("auto")
    assert isinstance(backend, XpuBackend) and backend.fast_dtype() == torch.bfloat16
    assert backend.report(torch.bfloat16, device="1") == {
        "device": "xpu:1", "device_name": "Intel Data Center GPU Max 1550", "attention": "grouped_sdpa",
        "device_memory": {"allocated": GIB, "reserved": 2 * GIB, "total": 64 * GIB},
        "kernels": {"attention": SDPA_LINE, **triton_kernels(torch.bfloat16)}}
    fake_xpu(monkeypatch, available=False)
    assert isinstance(get_backend("auto"), CpuBackend)
    with pytest.raises(RuntimeError, match="'xpu' is not available"):
        get_backend("xpu")


def test_cpu_report_is_the_host():
    report = CpuBackend().report(torch.float32)
    assert report["device"] == "cpu" and report["device_name"] == cpu_model()
    from poolgate.workers.kernels import cpu_attention_f32

    assert report["attention"] == ("packed_cpu_attention" if cpu_attention_f32.unavailable() is None
                                   else grouped_sdpa.__name__)  # fp32: the AVX2 kernel where it runs
    assert report["device_memory"]["total"] > report["device_memory"]["peak_rss"] > 0


def test_the_gateway_and_worker_registries_agree():
    from poolgate.shared.config.backends import DEVICE_ENV
    from poolgate.shared.config.model_settings import BACKEND_CHOICES

    assert set(DEVICE_ENV) == set(BACKENDS) | {"auto"} == set(BACKEND_CHOICES)


def test_cpu_bf16_follows_the_cpu_flags(monkeypatch):
    from poolgate.workers.backends import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert CpuBackend().fast_dtype() == torch.bfloat16
    monkeypatch.setattr(cpu, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert CpuBackend().fast_dtype() == torch.float32


def test_a_pinned_cpu_worker_uses_its_cores_only():
    code = ("import json, os, torch; from poolgate.workers.backends.cpu import CpuBackend; "
            "CpuBackend().setup(None, (0,)); "
            "print(json.dumps([sorted(os.sched_getaffinity(0)), torch.get_num_threads()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == [[0], 1]


def test_a_loaded_model_reports_where_it_runs():
    from poolgate.workers.load.build import load_model

    cfg = WorkerConfig(model=str(bundled_model_path()), served_model_name="m", backend="cpu",
                       dtype="float32", max_batch_tokens=256)
    info = load_model(cfg).info
    assert (info.backend, info.device, info.dtype) == ("cpu", "cpu", "float32")
    assert info.attention and info.device_name == cpu_model()
    from poolgate.workers.kernels.linear_fp32 import dnn_linear_available

    assert info.kernels["cpu_class"] == cpu_class().name
    assert info.kernels["linear"].startswith("oneDNN, fp32" if dnn_linear_available() else "torch")
    assert info.device_memory["peak_rss"] > 10_000_000  # the weights are in memory
    assert type(info).from_wire(json.loads(json.dumps(info.to_wire()))) == info


def test_a_gateway_pins_its_cpu_workers_to_disjoint_cores():
    """``poolgate serve --backend cpu --workers 2`` on the bundled model: each worker on its own cores."""
    from poolgate.shared.config.backends import available_cpus, physical_cores
    from tests.processes import children, free_port, wait_healthy

    if len(physical_cores(available_cpus())) < 2:
        pytest.skip("needs at least 2 physical cores")
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(port),
                                "--backend", "cpu", "--workers", "2", "--dtype", "float32",
                                "--max-batch-tokens", "256", "--max-model-len", "64"],
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=240, proc=gateway)
        sets = [os.sched_getaffinity(pid) for pid in children(gateway.pid)]
        assert len(sets) == 2 and not sets[0] & sets[1] and sets[0] | sets[1] <= set(available_cpus())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            assert json.load(response)["data"][0]["worker"]["device"] == "cpu"
    finally:
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=60) == 0
    assert "pinned to CPUs" in gateway.stderr.read()


@pytest.mark.parametrize("capability, flash", [((9, 0), True), ((8, 0), True), ((7, 5), False), ((7, 0), False)])
def test_half_precision_takes_flash_only_on_gpus_that_run_it(monkeypatch, capability, flash):
    from poolgate.workers.kernels.attention import has_varlen, varlen_flash

    fake_gpu(monkeypatch, hip=None, capability=capability)  # T4 = 7.5, V100 = 7.0: torch's flash refuses them
    want = varlen_flash if flash and has_varlen() else grouped_sdpa
    assert CudaBackend().attention(torch.float16) is want
    assert CudaBackend().attention(torch.float32) is grouped_sdpa


def test_bf16_without_its_instructions_runs_on_torchs_kernels_and_says_so_once(monkeypatch, caplog):
    """An AVX2 CPU (seen so through a patched view): bf16 is neither prepacked for oneDNN (which has no bf16
    there) nor refused; the worker warns once, naming the class and what ``auto`` picks instead."""
    from poolgate.shared.config.cpu import class_of
    from poolgate.workers.backends import cpu
    from poolgate.workers.kernels import linear
    from poolgate.workers.kernels.ops import REFERENCE

    avx2 = frozenset({"fpu", "avx", "avx2", "fma"})
    monkeypatch.setattr(cpu, "cpu_flags", lambda: avx2)
    monkeypatch.setattr(linear, "cpu_flags", lambda: avx2)
    monkeypatch.setattr(cpu, "cpu_class", lambda: class_of(avx2))
    cpu._say_slow.cache_clear()
    backend = CpuBackend()
    with caplog.at_level("WARNING", logger="poolgate.worker"):
        ops = backend.ops(torch.bfloat16)
        backend.ops(torch.bfloat16)
        backend.ops(torch.float32)
    assert ops.finalize is REFERENCE.finalize and backend.fast_dtype() == torch.float32
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1, said
    assert said[0].startswith("--dtype bfloat16 on this CPU (class avx2): no bf16 instructions and no oneDNN")
    assert said[0].endswith("--dtype auto picks float32 here")
    cpu._say_slow.cache_clear()


def test_the_kernels_report_says_what_each_op_runs_and_why_not_faster(monkeypatch):
    """bf16 on the CPU's own class (whatever it is) against an AVX2 view of it: the C kernels and oneDNN's
    prepacked linears are named where they run, and where they do not, the reason is."""
    from poolgate.shared.config.cpu import class_of
    from poolgate.workers.backends import cpu
    from poolgate.workers.kernels import cpu_attention, fused_norm, linear, linear_fp32

    here = CpuBackend().kernels(torch.bfloat16)
    assert here["cpu_class"] == cpu_class().name
    assert here["attention"].startswith("packed_cpu_attention (C, " if cpu_attention.unavailable() is None
                                        else "grouped_sdpa (")
    assert here["layer_norm"].startswith("fused" if fused_norm.unavailable() is None else "torch (")
    avx2 = frozenset({"fpu", "avx", "avx2", "fma"})
    for module in (cpu, linear):
        monkeypatch.setattr(module, "cpu_flags", lambda: avx2)
    for module in (cpu, linear_fp32):
        monkeypatch.setattr(module, "cpu_class", lambda: class_of(avx2))
    for kernel in (cpu_attention, fused_norm):
        monkeypatch.setattr(kernel, "unavailable", lambda: "the CPU lacks avx512_bf16")
    seen = CpuBackend().kernels(torch.bfloat16)
    assert seen == {"cpu_class": "avx2", "attention": "grouped_sdpa (the CPU lacks avx512_bf16)",
                    "layer_norm": "torch (the CPU lacks avx512_bf16)",
                    "linear": f"torch ({cpu.SLOW_DTYPES[('bfloat16', 'fallback')]})"}
    fp32 = CpuBackend().kernels(torch.float32)["linear"]
    assert fp32.startswith("oneDNN, fp32 weights prepacked" if torch.backends.mkldnn.is_available() else "torch (")
    monkeypatch.setattr(linear_fp32, "cpu_class", lambda: class_of(frozenset({"fpu"})))
    assert CpuBackend().kernels(torch.float32)["linear"].startswith("torch (MKL sgemm; ")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_off_runs_the_reference_ops_and_says_so(monkeypatch, tiny_bert, dtype):
    """``POOLGATE_CPU_KERNELS=off``: the ops, and so the model's output, are the torch references', bit for bit
    (the path of a CPU without the kernels' instructions or a compiler), and the report names the switch."""
    from poolgate.workers.backends import cpu
    from poolgate.workers.batch.packing import pack
    from poolgate.workers.kernels.ops import REFERENCE
    from poolgate.workers.load.st_config import read_spec
    from poolgate.workers.models import build_model

    monkeypatch.setenv(cpu.KERNELS_ENV, "off")
    backend = CpuBackend()
    ops = backend.ops(dtype)
    assert ops == REFERENCE and backend.attention(dtype) is grouped_sdpa
    report = backend.kernels(dtype)
    assert all(report[op].endswith("(POOLGATE_CPU_KERNELS=off)") for op in ("attention", "layer_norm", "linear"))
    spec = read_spec(WorkerConfig(model=str(tiny_bert[0]), served_model_name="t"))
    batch = pack([[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3]])
    outs = []
    for bundle in (ops, REFERENCE):
        torch.manual_seed(0)
        model, _ = build_model(spec, bundle, allow_pickle=False)
        model = model.to(dtype)
        bundle.finalize(model)
        with torch.no_grad():
            outs.append(model(batch))
    assert torch.equal(*outs)
    monkeypatch.delenv(cpu.KERNELS_ENV)
    if dtype == torch.float32 and cpu.dnn_linear_available() or dtype == torch.bfloat16 and (
            cpu.packed_linear_available()):
        assert backend.ops(dtype) != REFERENCE  # the switch is what held the kernels back
