"""``poolgate bench-runner``: one model folder's runner alone (forward + pooling on packed batches), in-process.

No server and no HTTP: ``workers.tools.runner_bench`` loads the folder as a
worker would (backend, dtype, token budget), tokenizes the synthetic corpus
and times ``execute`` over prepared batches, then ``prepare`` + ``execute``.
Prints a line per figure and the report as one JSON line (the last line of
stdout; also to ``--json``). torch is imported only when the command runs.
Exit 0 on a run, 2 when the model cannot load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from poolgate.shared.config.flags import positive_int
from poolgate.shared.config.model_settings import DTYPE_CHOICES

BACKENDS = ("auto", "cpu", "cuda", "rocm", "xpu")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``poolgate bench-runner``."""
    parser.add_argument("model", help="model folder (e.g. one written by poolgate bench-arch --write-to)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    parser.add_argument("--num-texts", type=positive_int, default=2048, help="synthetic corpus size")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed")
    parser.add_argument("--passes", type=positive_int, default=1, help="whole-corpus passes")
    parser.add_argument(
        "--max-batch-tokens", type=positive_int, default=None, help="token budget of one batch (default: the backend's)"
    )
    parser.add_argument("--max-model-len", type=positive_int, default=None, help="tokens per text at most")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="run batches as CUDA graphs (cuda; see poolgate serve --help)"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON report here")


def main(args: argparse.Namespace) -> int:
    from poolgate.workers.memory import bound_memory

    bound_memory()  # the worker's allocator bounds, before torch loads: measured as the worker runs
    from poolgate.workers.tools.runner_bench import RunnerBench, run_runner_bench

    cfg = RunnerBench(
        model_path=args.model,
        backend=args.backend,
        dtype=args.dtype,
        num_texts=args.num_texts,
        seed=args.seed,
        max_batch_tokens=args.max_batch_tokens,
        max_model_len=args.max_model_len,
        passes=args.passes,
        cuda_graphs=args.cuda_graphs,
    )
    try:
        report = run_runner_bench(cfg)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"poolgate bench-runner: cannot run: {exc}", file=sys.stderr)
        return 2
    print(
        f"{report['architecture']} on {report['device']} ({report['device_name'] or report['backend']}), "
        f"{report['dtype']}, {report['attention']}: {report['tokens']:,} tokens in {report['batches']} batches "
        f"of <= {report['max_batch_tokens']}"
    )
    print(f"  execute (forward + pooling + copy back): {report['execute_tokens_per_s']:>12,.1f} tokens/s")
    print(f"  prepare + execute, one after the other:  {report['tokens_per_s']:>12,.1f} tokens/s")
    peak, share = report["gemm_peak"], report["gemm_peak_share"]
    int8 = "-" if peak.get("int8_gflops") is None else f"{peak['int8_gflops']:,.1f}"
    print(
        f"  linear layers: {report['linear_gflops']:,.1f} GFLOP/s, "
        f"{'-' if share is None else f'{share:.0%}'} of a measured {peak['dtype']} GEMM peak of "
        f"{peak.get('float_gflops') or 0:,.1f} GFLOP/s (int8 GEMM peak: {int8})"
    )
    print(f"  cuda graphs: {report['cuda_graphs']} ({report['graphs_captured']} captured)")
    att = report["attention_share"]
    print(f"  attention: {'-' if att is None else f'{att:.1%}'} of a one-thread forward")
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n", encoding="utf-8")
    return 0
