"""shared.config.cpu: reading /proc/cpuinfo, the CPU classes, the override that shows a smaller CPU, each dtype's path."""
from __future__ import annotations

import pytest

from poolgate.shared.config import cpu

SPR = {"fpu", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni",
       "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}  # a Sapphire Rapids Xeon
ZEN4 = {"fpu", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
ZEN3 = {"fpu", "avx", "avx2", "fma", "sse4_2"}
SKX = {"fpu", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
GRAVITON3 = {"fp", "asimd", "asimdhp", "sve", "bf16"}


def test_cpuinfo_fields_are_the_first_cpus(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                    "flags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert cpu.machine_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert (cpu.cpu_vendor(info), cpu.cpu_model(info)) == ("AuthenticAMD", "AMD EPYC 9R14")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n")
    assert cpu.machine_flags(arm) == {"fp", "asimd", "bf16"}
    assert cpu.machine_flags(tmp_path / "missing") == set() and cpu.cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.parametrize("flags, name", [(SPR, "amx"), (ZEN4, "avx512_bf16"), (SKX, "avx512"), (ZEN3, "avx2"),
                                         (GRAVITON3, "generic"), ({"avx2"}, "generic")])
def test_each_cpu_falls_in_the_biggest_class_whose_flags_it_has(flags, name):
    assert cpu.class_of(flags).name == name


def test_classes_grow_one_on_the_other():
    for small, big in zip(cpu.CPU_CLASSES, cpu.CPU_CLASSES[1:]):
        assert small.needs < big.needs


@pytest.mark.parametrize("name", cpu.CLASS_NAMES)
def test_the_override_shows_exactly_the_class_asked_for(name):
    shown = cpu.shown_flags(SPR, name)
    assert cpu.class_of(shown).name == name
    assert "fpu" in shown  # what no class tells apart stays


def test_the_avx2_view_of_a_xeon_has_no_avx512_amx_or_vnni():
    shown = cpu.shown_flags(SPR, "avx2")
    assert shown == {"fpu", "avx", "avx2", "fma"}
    assert cpu.shown_flags(SPR, None) == SPR and cpu.shown_flags(ZEN3, "avx2") == ZEN3


def test_an_override_above_the_machine_or_not_a_class_is_refused():
    with pytest.raises(ValueError, match="asks for more than this CPU has \\(class avx2\\)"):
        cpu.shown_flags(ZEN3, "avx512_bf16")
    with pytest.raises(ValueError, match="not a CPU class; use one of generic, avx2, avx512, avx512_bf16, amx"):
        cpu.shown_flags(ZEN3, "zen3")


def test_applying_the_override_caps_onednn_aten_and_mkl_unless_the_environment_did():
    env = {cpu.CPU_CLASS_ENV: "avx2"}
    assert cpu.apply_cpu_class(env, SPR).name == "avx2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"  # MKL runs torch's fp32 matmuls
    env = {cpu.CPU_CLASS_ENV: "avx512", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    cpu.apply_cpu_class(env, SPR)
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx512"
    env = {cpu.CPU_CLASS_ENV: "avx512_bf16"}  # the machine's own class: nothing to cap
    assert cpu.apply_cpu_class(env, ZEN4).name == "avx512_bf16" and set(env) == {cpu.CPU_CLASS_ENV}
    env = {}
    assert cpu.apply_cpu_class(env, SPR) is None and env == {}
    with pytest.raises(ValueError):
        cpu.apply_cpu_class({cpu.CPU_CLASS_ENV: "amx"}, ZEN3)


@pytest.mark.parametrize("flags, bf16, fp16", [(SPR, "native", "native"), (ZEN4, "native", "fallback"),
                                               (SKX, "onednn", "fallback"), (ZEN3, "fallback", "fallback"),
                                               ({"avx2", "fma", "avx_ne_convert"}, "onednn", "fallback"),
                                               (GRAVITON3, "native", "native")])
def test_each_dtype_has_one_path_per_cpu(flags, bf16, fp16):
    assert (cpu.dtype_path("float32", flags), cpu.dtype_path("bfloat16", flags),
            cpu.dtype_path("float16", flags)) == ("native", bf16, fp16)
    with pytest.raises(ValueError):
        cpu.dtype_path("int4", flags)


def test_a_onednn_cap_set_alone_makes_poolgate_see_that_class_too():
    """ONEDNN_MAX_CPU_ISA=AVX2 without POOLGATE_CPU_CLASS takes oneDNN's bf16 path away: poolgate sees avx2, so
    it never prepacks bf16 weights for a oneDNN that would refuse them."""
    assert cpu.seen_class(SPR, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == "avx2"
    assert cpu.seen_class(SPR, {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}) == "avx512_bf16"
    assert cpu.seen_class(SPR, {"ONEDNN_MAX_CPU_ISA": "ALL"}) is None
    assert cpu.seen_class(ZEN3, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}) is None  # a cap above the CPU: none
    both = {cpu.CPU_CLASS_ENV: "avx512", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cpu.seen_class(SPR, both) == "avx2"  # the smaller of the two
    assert cpu.seen_class(SPR, {cpu.CPU_CLASS_ENV: "amx"}) is None and cpu.seen_class(SPR, {}) is None
    with pytest.raises(ValueError):
        cpu.seen_class(ZEN3, {cpu.CPU_CLASS_ENV: "avx512"})
    assert set(cpu.ONEDNN_CLASSES.values()) <= set(cpu.CLASS_NAMES)
