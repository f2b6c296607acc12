"""``poolgate bench-lora``: run-time LoRA adapters' cost on one model's runner, in-process (base, one, four mixed).

``workers.tools.lora_bench`` loads the folder with ``--max-loras 4``, writes and
loads four random adapters of ``--rank`` on every linear it can take, and times
the synthetic corpus on the base model, on one adapter, and with four adapters
mixed in every batch. Prints a line per figure and the report as one JSON line
(the last line of stdout). torch is imported only when the command runs. Exit 0
on a run, 2 when the model cannot load or take adapters.
"""

from __future__ import annotations

import argparse
import json
import sys

from poolgate.shared.config.flags import positive_int
from poolgate.shared.config.model_settings import DTYPE_CHOICES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``poolgate bench-lora``."""
    parser.add_argument("model", help="model folder of a packed family (e.g. one written by bench-arch --write-to)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32")
    parser.add_argument("--rank", type=positive_int, default=16, help="the adapters' LoRA rank")
    parser.add_argument("--num-texts", type=positive_int, default=256, help="synthetic corpus size")
    parser.add_argument("--seed", type=int, default=0, help="corpus and adapter seed")
    parser.add_argument(
        "--max-model-len", type=positive_int, default=None, help="tokens per text at most (default: the model's)"
    )
    parser.add_argument(
        "--max-batch-tokens", type=positive_int, default=None, help="token budget of one batch (default: the backend's)"
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed passes per way (the best counts)")


def main(args: argparse.Namespace) -> int:
    from poolgate.workers.tools.lora_bench import LoraBench, run_lora_bench

    cfg = LoraBench(
        model_path=args.model,
        dtype=args.dtype,
        rank=args.rank,
        num_texts=args.num_texts,
        seed=args.seed,
        max_batch_tokens=args.max_batch_tokens,
        max_model_len=args.max_model_len,
        repeats=args.repeats,
    )
    try:
        report = run_lora_bench(cfg)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"poolgate bench-lora: cannot run: {exc}", file=sys.stderr)
        return 2
    print(
        f"{report['architecture']} ({report['device_name']}), {report['dtype']}, rank {report['rank']} on "
        f"{report['targets']} linears: {report['tokens']:,} tokens in {report['batches']} batches"
    )
    for way, rate in report["tokens_per_s"].items():
        cost, cpu_cost = report["overhead"].get(way), report["cpu_overhead"].get(way)
        line = f"  {way:<12} {rate:>10,.1f} tokens/s  {report['tokens_per_cpu_s'][way]:>10,.1f} tokens/CPU-s"
        print(line + ("" if cost is None else f"  (overhead {cost:+.1%} wall, {cpu_cost:+.1%} CPU)"))
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0
