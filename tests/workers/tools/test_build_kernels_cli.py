"""``poolgate build-kernels``: every variant into the cache, each path printed; one line and exit 1 when it cannot."""
import stat

import pytest

from poolgate.gateway.cli import main as poolgate
from poolgate.workers.kernels import cbuild


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLGATE_KERNEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_builds_each_variant_into_the_cache_and_prints_its_path(cache, capsys):
    if cbuild.compiler() is None:
        pytest.skip("no C compiler here")
    assert poolgate(["build-kernels", "32", "48"]) == 0
    printed = capsys.readouterr().out.split()
    names = sorted(p.rsplit("/", 1)[1].rsplit("_", 1)[0] for p in printed)
    assert names == ["fused_norm", "gelu_f32", "packed_attention_f32_hd32", "packed_attention_f32_hd48", "packed_attention_hd32",
                     "packed_attention_hd32_amx", "packed_attention_hd48"]
    assert sorted(printed) == sorted(str(p) for p in cache.iterdir())  # all of them, and nothing else
    assert poolgate(["build-kernels", "32", "48"]) == 0  # built once: found again
    assert capsys.readouterr().out.split() == printed


def test_no_compiler_is_one_line_and_exit_1(cache, capsys, monkeypatch):
    monkeypatch.setattr(cbuild, "compiler", lambda: None)
    assert poolgate(["build-kernels", "64"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == "poolgate build-kernels: no C compiler (set CC, or install gcc)\n"


def test_a_failed_build_is_one_line_and_exit_1(cache, tmp_path, capsys, monkeypatch):
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'packed_attention.c:1: error: one' >&2\necho 'and two' >&2\nexit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(cc))
    assert poolgate(["build-kernels", "16"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"poolgate build-kernels: {cc} failed on ")
    assert err.rstrip().endswith("error: one and two")
    assert not cache.exists() or not any(cache.glob("*.so"))  # no half-built file left


def test_a_head_dim_the_kernel_does_not_take_is_exit_2(cache, capsys):
    assert poolgate(["build-kernels", "32", "24"]) == 2
    assert capsys.readouterr().err == ("poolgate build-kernels: error: the kernel takes head dims of 16 to 256 in "
                                       "steps of 16, not 24\n")
