"""The installed package: one `poolgate` namespace, nothing else at top level, one version."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCE_FOLDERS = {"gateway": "poolgate.gateway", "workers": "poolgate.workers", "shared": "poolgate.shared",
                  "integrations": "poolgate.integrations"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_source_package_is_listed():
    """A new sub-package left out of pyproject's list would be missing from every install."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {
        ".".join([SOURCE_FOLDERS[init.relative_to(ROOT).parts[0]], *init.relative_to(ROOT).parts[1:-1]])
        for folder in SOURCE_FOLDERS for init in (ROOT / folder).rglob("__init__.py")
    }
    assert found == listed


def test_version_comes_from_the_package_metadata():
    from poolgate.shared.version import VERSION

    assert VERSION == _pyproject()["project"]["version"]


def test_only_poolgate_is_importable_from_outside_the_repo(tmp_path):
    code = (
        "import importlib, poolgate, poolgate.gateway.app, poolgate.workers.engine.engine, poolgate.shared.wire.messages\n"
        "import poolgate.integrations.ray\n"
        "for name in ('gateway', 'workers', 'shared', 'integrations'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    raise SystemExit(f'top-level {name!r} is importable')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


def test_cli_entry_points_answer_help(tmp_path):
    for args in (["--version"], ["serve", "--help"], ["worker", "--help"], ["bench", "--help"]):
        out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", *args], cwd=tmp_path,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_wheel_holds_only_the_poolgate_namespace(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in SOURCE_FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(src)], check=True)
    (wheel,) = tmp_path.glob("poolgate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"poolgate"}
    assert not any(n.startswith("poolgate/__init__") for n in names)  # a namespace, not a package
    sources = {f"{SOURCE_FOLDERS[p.relative_to(ROOT).parts[0]].replace('.', '/')}/"
               f"{'/'.join(p.relative_to(ROOT).parts[1:])}" for f in SOURCE_FOLDERS for p in (ROOT / f).rglob("*.py")}
    assert sources <= set(names)
    assert "poolgate/shared/domain/words.txt" in names
    assert "poolgate/workers/kernels/packed_attention.c" in names  # built on the machine by cpu_attention.py
    assert "poolgate/workers/kernels/packed_attention_f32.c" in names  # built by cpu_attention_f32.py
