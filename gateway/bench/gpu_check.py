"""Every GPU test and every GPU row of the speed table in one run, written as JSON (``.ci/gpu-check`` wraps it).

On a machine with an NVIDIA GPU: ``pytest -m cuda``; random-weight BERT-base and
Qwen3-0.6B folders (``poolgate bench-arch --write-to``); the BERT runner alone on packed batches
(``poolgate bench-runner``); ``poolgate serve`` + ``poolgate bench`` over HTTP
(base64) for BERT-base in fp16 with sentence-transformers fp16 in the same run,
then one 16-token request at a time (p50 latency); the same HTTP run for
Qwen3-0.6B (LAST pooling). Then the serving levers (docs/operations.md, "GPU serving
levers"): the runner again with ``--cuda-graphs`` (graphs against eager), the BERT
HTTP and 16-token latency runs with ``--cuda-graphs``, the BERT HTTP run with two
workers on the one GPU (``--replicas-per-device 2``) against one, the token budget
the worker chose from the GPU's memory, ``pytest -m cuda tests/workers/kernels/gpu``
(the Triton kernels, compiled), and the levers' CPU tests (graph padding, placement,
budget, staging). Each step runs as its own process under a time limit
and the run goes on after a failure, so one JSON holds every row: the figure,
the target, whether it was met, the command, and the step's output tail on error.

``--dry-run`` runs the same steps on the CPU with tiny shapes and a few texts
(the GPU tests then skip; two CPU workers stand in for two per GPU, and graphs
report why they are off), so CI keeps the script from rotting; its figures mean
nothing. The pytest step runs only the test files that carry the ``cuda`` mark,
so a bare machine needs no test tool beyond pytest and pytest-asyncio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Plan:
    """What one run uses: shapes, device, dtype, corpus size and step time limits."""

    bert: tuple[str, str]
    qwen: tuple[str, str]
    backend: str
    dtype: str
    texts: int
    latency_requests: int
    concurrency: int
    batch_size: int
    st_batch_size: int
    step_timeout_s: float
    two_workers: tuple[str, ...] = ("--replicas-per-device", "2")  # two workers on the one device


GPU = Plan(("bert", "base"), ("qwen3", "0.6b"), "cuda", "float16", 8192, 300, 64, 64, 256, 150.0)
DRY = Plan(("bert", "tiny"), ("qwen3", "tiny"), "cpu", "float32", 48, 20, 4, 8, 16, 120.0, ("--workers", "2"))
KERNEL_TESTS = "tests/workers/kernels/gpu"  # the Triton kernels' GPU tests: their own step
LEVER_TESTS = (  # the levers' CPU tests: graph shapes and padding, placement, token budget, staging buffers
    "tests/workers/engine/test_graph_batch.py",
    "tests/shared/test_backends.py",
    "tests/workers/backends/test_budget.py",
    "tests/workers/backends/test_staging.py",
)
ROOT = Path(__file__).resolve().parents[2]  # the working tree (tests/ beside workers/)
TARGETS = {  # row → (metric, target, unit)
    "bert_http": ("tokens_per_s", 2_000_000, "tokens/s"),
    "bert_vs_st": ("ratio_vs_sentence_transformers", 15.0, "x"),
    "bert_runner": ("execute_tokens_per_s", 3_000_000, "tokens/s"),
    "qwen_http": ("tokens_per_s", 400_000, "tokens/s"),
    "bert_latency_p50": ("p50_ms", 3.0, "ms (at most)"),
    "bert_runner_graphs": ("execute_tokens_per_s", 3_000_000, "tokens/s"),
    "graphs_vs_eager": ("execute_tokens_per_s", 1.0, "x"),
    "bert_http_graphs": ("tokens_per_s", 2_000_000, "tokens/s"),
    "bert_latency_p50_graphs": ("p50_ms", 3.0, "ms (at most)"),
    "bert_http_2_per_gpu": ("tokens_per_s", 2_000_000, "tokens/s"),
    "two_vs_one_per_gpu": ("tokens_per_s", 1.0, "x"),
    "token_budget": ("max_batch_tokens", 16384, "tokens"),
}
RATIOS = {
    "graphs_vs_eager": ("bert_runner_graphs", "bert_runner"),
    "two_vs_one_per_gpu": ("bert_http_2_per_gpu", "bert_http"),
}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "poolgate.gateway.cli", *args]


def _step(cmd: list[str], timeout_s: float) -> dict:
    """Run ``cmd``; its exit code, seconds, the JSON of its last stdout line (if any) and an output tail."""
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or ""  # bytes even with text=True (CPython's TimeoutExpired)
        out = partial.decode() if isinstance(partial, bytes) else partial
        rc, err = 124, f"timed out after {timeout_s:.0f} s"
    lines = [line for line in out.splitlines() if line.strip()]
    report = None
    with contextlib.suppress(ValueError, IndexError):
        report = json.loads(lines[-1])
    return {
        "command": " ".join(cmd),
        "rc": rc,
        "seconds": round(time.perf_counter() - start, 2),
        "report": report,
        "tail": None if rc == 0 else (out[-1500:] + "\n" + (err or "")[-1500:]),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(folder: Path, plan: Plan, extra: tuple[str, ...] = ()) -> Iterator[str | None]:
    """``poolgate serve FOLDER`` on a free port until the block ends; yields the URL (None if it never came up)."""
    port = _free_port()
    proc = subprocess.Popen(
        _cli("serve", str(folder), "--port", str(port), "--backend", plan.backend, "--dtype", plan.dtype, *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + plan.step_timeout_s
    ready = False
    while time.monotonic() < deadline and proc.poll() is None and not ready:
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"{url}/health", timeout=2) as resp,
        ):
            ready = resp.status == 200
        time.sleep(0.3)
    try:
        yield url if ready else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _http_steps(folder: Path, plan: Plan, *, compare: bool, latency: bool, extra: tuple[str, ...] = ()) -> dict:
    steps = {}
    with serving(folder, plan, extra) as url:
        if url is None:
            return {
                "serve": {
                    "command": f"poolgate serve {folder}",
                    "rc": 1,
                    "report": None,
                    "tail": "the server never became healthy",
                }
            }
        bench = [
            "bench",
            "--url",
            url,
            "--encoding-format",
            "base64",
            "--num-texts",
            str(plan.texts),
            "--concurrency",
            str(plan.concurrency),
            "--batch-size",
            str(plan.batch_size),
        ]
        if compare:
            bench += [
                "--compare-sentence-transformers",
                "--st-model",
                str(folder),
                "--st-device",
                plan.backend,
                "--st-dtype",
                plan.dtype,
                "--st-batch-size",
                str(plan.st_batch_size),
            ]
        steps["http"] = _step(_cli(*bench), plan.step_timeout_s)
        if latency:
            steps["latency"] = _step(
                _cli(
                    "bench",
                    "--url",
                    url,
                    "--latency",
                    "--latency-tokens",
                    "16",
                    "--num-texts",
                    str(plan.latency_requests),
                ),
                plan.step_timeout_s,
            )
    return steps


def _value(step: dict[str, Any] | None, metric: str) -> Any:
    report = (step or {}).get("report") or {}
    if metric == "p50_ms":
        return (report.get("latency_ms") or {}).get("p50")
    return report.get(metric)


def rows(steps: dict) -> list[dict]:
    """The table: one row per target, measured where its step ran."""
    where = {
        "bert_http": steps.get("bert", {}).get("http"),
        "bert_vs_st": steps.get("bert", {}).get("http"),
        "bert_runner": steps.get("bert_runner"),
        "qwen_http": steps.get("qwen", {}).get("http"),
        "bert_latency_p50": steps.get("bert", {}).get("latency"),
        "bert_runner_graphs": steps.get("bert_runner_graphs"),
        "graphs_vs_eager": steps.get("bert_runner_graphs"),
        "bert_http_graphs": steps.get("bert_graphs", {}).get("http"),
        "bert_latency_p50_graphs": steps.get("bert_graphs", {}).get("latency"),
        "bert_http_2_per_gpu": steps.get("bert_2_per_gpu", {}).get("http"),
        "two_vs_one_per_gpu": steps.get("bert_2_per_gpu", {}).get("http"),
        "token_budget": steps.get("bert_runner"),
    }
    out = []
    for name, (metric, target, unit) in TARGETS.items():
        value = _value(where[name], metric)
        if name in RATIOS:  # this row's figure over the other row's
            base = _value(where[RATIOS[name][1]], metric)
            value = round(value / base, 3) if value is not None and base else None
        met = None if value is None else (value <= target if unit.startswith("ms") else value >= target)
        out.append(
            {
                "row": name,
                "metric": metric,
                "measured": value,
                "target": target,
                "unit": unit,
                "met": met,
                "command": (where[name] or {}).get("command"),
            }
        )
    return out


def cuda_test_files() -> list[str]:
    """The test files that hold a ``cuda``-marked test, relative to the tree."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.cuda" in p.read_text(encoding="utf-8") and not str(p.relative_to(ROOT)).startswith(KERNEL_TESTS)
    )


def _pytest(*args: str, timeout_s: float = 240.0) -> dict:
    return _step([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], timeout_s)


def run(plan: Plan, work: Path) -> dict:
    started = time.perf_counter()
    steps: dict = {"pytest_cuda": _pytest("-m", "cuda", *cuda_test_files())}
    if (ROOT / KERNEL_TESTS).is_dir():
        steps["pytest_kernels_gpu"] = _pytest("-m", "cuda", KERNEL_TESTS)
    else:
        steps["pytest_kernels_gpu"] = {
            "command": f"pytest -m cuda {KERNEL_TESTS}",
            "rc": 0,
            "report": None,
            "tail": f"{KERNEL_TESTS} is not in this tree: nothing to run",
        }
    steps["pytest_levers_cpu"] = _pytest("-m", "not cuda", *LEVER_TESTS)
    bert, qwen = work / "bert", work / "qwen"
    for folder, (family, shape) in ((bert, plan.bert), (qwen, plan.qwen)):
        steps[f"write_{folder.name}"] = _step(
            _cli("bench-arch", "--family", family, "--shape", shape, "--write-to", str(folder)), plan.step_timeout_s
        )
    steps["bert_runner"] = _step(
        _cli(
            "bench-runner", str(bert), "--backend", plan.backend, "--dtype", plan.dtype, "--num-texts", str(plan.texts)
        ),
        plan.step_timeout_s,
    )
    steps["bert_runner_graphs"] = _step(
        _cli(
            "bench-runner",
            str(bert),
            "--backend",
            plan.backend,
            "--dtype",
            plan.dtype,
            "--num-texts",
            str(plan.texts),
            "--cuda-graphs",
        ),
        plan.step_timeout_s,
    )
    steps["bert"] = _http_steps(bert, plan, compare=True, latency=True)
    steps["bert_graphs"] = _http_steps(bert, plan, compare=False, latency=True, extra=("--cuda-graphs",))
    steps["bert_2_per_gpu"] = _http_steps(bert, plan, compare=False, latency=False, extra=plan.two_workers)
    steps["qwen"] = _http_steps(qwen, plan, compare=False, latency=False)
    return {
        "dry_run": plan is DRY,
        "backend": plan.backend,
        "dtype": plan.dtype,
        "shapes": {"bert": "/".join(plan.bert), "qwen": "/".join(plan.qwen)},
        "rows": rows(steps),
        "steps": steps,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m poolgate.gateway.bench.gpu_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (CI), no pytest step")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="poolgate-gpu-check-") as tmp:
        result = run(DRY if args.dry_run else GPU, Path(tmp))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for row in result["rows"]:
        print(
            f"{row['row']:18s} {row['measured']!s:>14} {row['unit']:14s} target {row['target']:>10}  met={row['met']}"
        )
    failed = [name for name, s in _flat(result["steps"]) if s.get("rc") != 0]
    print(f"{len(failed)} step(s) failed: {', '.join(failed)}" if failed else "every step ran", file=sys.stderr)
    return 1 if failed else 0


def _flat(steps: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, s in steps.items():
        if "rc" in s:
            yield prefix + name, s
        else:
            yield from _flat(s, f"{prefix}{name}.")


if __name__ == "__main__":
    sys.exit(main())
