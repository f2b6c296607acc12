"""The GPU check's dry run (CI): ``.ci/gpu-check OUT --dry-run`` runs every step on the CPU with tiny shapes
from the working tree (the shim the bare GPU machine uses) and writes every row of the table as JSON."""
import json
import subprocess
from pathlib import Path

from poolgate.gateway.bench.gpu_check import KERNEL_TESTS, TARGETS, cuda_test_files, rows

ROOT = Path(__file__).resolve().parents[3]


def test_dry_run_writes_every_row(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([str(ROOT / ".ci" / "gpu-check"), str(out), "--dry-run"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["backend"] == "cpu"
    assert [r["row"] for r in result["rows"]] == list(TARGETS)
    for row in result["rows"]:
        assert isinstance(row["measured"], (int, float)) and row["measured"] > 0, row
        assert row["command"] and row["met"] in (True, False)
    assert result["steps"]["pytest_cuda"]["rc"] == 0  # the cuda-marked files, skipped on the CPU
    http = result["steps"]["bert"]["http"]["report"]
    assert http["errors"] == 0 and http["sentence_transformers"]["device"] == "cpu"
    steps = result["steps"]
    assert steps["pytest_levers_cpu"]["rc"] == 0 and steps["pytest_kernels_gpu"]["rc"] == 0
    graphs = steps["bert_runner_graphs"]["report"]  # the flag's path on the CPU: graphs off, and why
    assert graphs["cuda_graphs"].startswith("off: CUDA graphs are for the cuda backend")
    assert graphs["graphs_captured"] == 0
    two = steps["bert_2_per_gpu"]["http"]
    assert two["report"]["errors"] == 0 and steps["bert_graphs"]["http"]["report"]["errors"] == 0
    table = {r["row"]: r for r in result["rows"]}
    assert table["token_budget"]["measured"] == steps["bert_runner"]["report"]["max_batch_tokens"]
    latency = result["steps"]["bert"]["latency"]["report"]
    assert latency["mode"] == "latency" and latency["batch_size"] == 1 and latency["concurrency"] == 1
    assert latency["prompt_tokens"] == 16 * latency["requests"]  # 14 one-token words + [CLS]/[SEP]


def test_the_pytest_step_finds_the_cuda_tests():
    files = cuda_test_files()
    assert "tests/workers/backends/test_cuda.py" in files and all(f.startswith("tests/") for f in files)
    assert "tests/workers/engine/test_cuda_graphs.py" in files
    assert not any(f.startswith(KERNEL_TESTS) for f in files)  # the Triton kernels' tests run as their own step


def test_rows_say_when_a_step_gave_no_figure():
    table = rows({"bert": {"http": {"rc": 1, "report": None, "command": "poolgate bench ..."}}})
    assert all(r["measured"] is None and r["met"] is None for r in table)
    met = rows({"bert": {"latency": {"rc": 0, "command": "c", "report": {"latency_ms": {"p50": 2.5}}}}})
    assert next(r for r in met if r["row"] == "bert_latency_p50")["met"] is True  # a latency target is a maximum
    ratio = rows({"bert_runner": {"rc": 0, "command": "a", "report": {"execute_tokens_per_s": 2.0e6}},
                  "bert_runner_graphs": {"rc": 0, "command": "b", "report": {"execute_tokens_per_s": 3.0e6}}})
    graphs = next(r for r in ratio if r["row"] == "graphs_vs_eager")
    assert graphs["measured"] == 1.5 and graphs["met"] is True and graphs["command"] == "b"
