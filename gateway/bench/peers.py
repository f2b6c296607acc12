"""``poolgate bench --compare-peers``: the CPU runtimes poolgate is measured against, in the same run.

After the HTTP run (and the sentence-transformers baseline, when asked) each
peer named encodes the same texts in this process (``workers.tools.peers``:
ONNX Runtime and OpenVINO over an ONNX export of the ``--st-model`` folder,
sentence-transformers' own ONNX and OpenVINO backends), ``--passes`` times, on
``--peer-threads`` threads, in batches of ``--st-batch-size``. Each peer's
vectors get their worst cosine to sentence-transformers float32, as
poolgate's do; a peer under 0.999 is not accurate and is left out of the
"fastest accurate peer" poolgate's ratio is taken to. A peer this install
cannot run is reported as skipped, with the reason. The report also names the
CPU: its model and the class poolgate sees (``shared.config.cpu``;
``POOLGATE_CPU_CLASS`` binds torch and oneDNN only, the peers pick their own
instructions).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from poolgate.gateway.bench.accuracy import ACCURATE, Fp32, cosines, model_path
from poolgate.shared.config.backends import available_cpus, physical_cores
from poolgate.shared.config.cpu import cpu_class, cpu_model
from poolgate.shared.config.flags import positive_int

PEERS = ("onnxruntime", "openvino", "openvino-bf16", "st-onnx", "st-openvino")  # as workers.tools.peers names them


def peer_list(value: str) -> list[str]:
    """``--compare-peers``: names joined by commas, or ``all``."""
    names = list(PEERS) if value.strip() == "all" else [v.strip() for v in value.split(",") if v.strip()]
    if not names or any(n not in PEERS for n in names):
        raise argparse.ArgumentTypeError(f"peers are 'all' or a comma list of {', '.join(PEERS)}; got {value!r}")
    return list(dict.fromkeys(names))


def default_threads() -> int:
    """The physical cores of this process's CPUs: the torch threads one CPU worker of ``poolgate serve`` runs."""
    return len(physical_cores(available_cpus()))


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("CPU peers (gateway.bench.peers)")
    group.add_argument(
        "--compare-peers",
        type=peer_list,
        default=None,
        metavar="PEERS",
        help=f"also encode the corpus in-process with these CPU runtimes ({', '.join(PEERS)}; or 'all'), "
        "on the --st-model folder, and report each one's tokens/s, poolgate's ratio to it and its worst cosine "
        "to sentence-transformers float32",
    )
    group.add_argument(
        "--peer-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads each peer runs on (default: the physical cores of this process's CPUs, as a CPU worker)",
    )


def cpu_info() -> dict[str, str]:
    """The CPU the run measured: its model name and the class poolgate sees."""
    return {"class": cpu_class().name, "model": cpu_model()}


def run_peers(args: argparse.Namespace, texts: list[str], report: dict, fp32: Fp32) -> dict:
    """A copy of ``report`` with the peers, each one's ratio and cosine, the fastest accurate peer and the CPU."""
    from poolgate.workers.tools.peers import run_peers as run

    threads = args.peer_threads or default_threads()
    results, vectors = run(
        texts,
        model_path=model_path(args),
        peers=args.compare_peers,
        threads=threads,
        batch_size=args.st_batch_size,
        passes=args.passes,
    )
    return {
        **score(report, results, vectors, fp32.vectors() if vectors else None),
        "cpu": cpu_info(),
        "peer_threads": threads,
    }


def score(
    report: dict, results: dict[str, dict], vectors: dict[str, np.ndarray], ref: np.ndarray | None
) -> dict[str, Any]:
    """Each peer's worst cosine to ``ref`` (float32 sentence-transformers), accuracy and poolgate's ratio to it
    (``results`` gains them), and the fastest accurate peer with poolgate's ratio to it."""
    ours = report["tokens_per_s"]
    for name, got in vectors.items():
        peer = results[name]
        peer["ratio"] = ours / peer["tokens_per_s"] if peer["tokens_per_s"] > 0 else None
        if ref is None or got.shape != ref.shape:
            peer.update(worst_cosine=None, accurate=False)
            continue
        cos = cosines(got, ref)
        peer.update(worst_cosine=float(cos.min()), mean_cosine=float(cos.mean()), accurate=bool(cos.min() >= ACCURATE))
    accurate = [n for n, p in results.items() if p.get("accurate") and p["tokens_per_s"] > 0]
    fastest = max(accurate, key=lambda n: results[n]["tokens_per_s"], default=None)
    return {
        **report,
        "peers": results,
        "fastest_accurate_peer": fastest,
        "ratio_vs_fastest_accurate_peer": results[fastest]["ratio"] if fastest else None,
    }


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_peers(report: dict) -> str:
    """The peers' table under the main one."""
    cpu = report["cpu"]
    st = report.get("sentence_transformers")
    lines = [
        "",
        f"CPU peers on {cpu['model']} (class {cpu['class']}), {report['peer_threads']} threads each, "
        f"same texts, worst cosine to sentence-transformers float32 (accurate: >= {ACCURATE})",
    ]
    rows = [("peer", "dtype", "tokens/s", "poolgate/peer", "worst cosine", "accurate")]
    rows.append(("poolgate", "-", _cell(report["tokens_per_s"], ",.1f"), "1.00x", _cosine(report), "-"))
    if st:
        ratio = report.get("ratio_vs_sentence_transformers")
        rows.append(
            (f"sentence-transformers ({st['device']})", st["dtype"], _cell(st["tokens_per_s"], ",.1f"),
             _cell(ratio, ".2f") + "x", _st_cosine(report), "-")
        )  # fmt: skip
    skipped = []
    for name, p in report["peers"].items():
        if "skipped" in p:
            skipped.append(f"  {name}: skipped, {p['skipped']}")
            continue
        rows.append(
            (name, p["dtype"], _cell(p["tokens_per_s"], ",.1f"), _cell(p.get("ratio"), ".2f") + "x",
             _cell(p.get("worst_cosine"), ".6f"), "yes" if p.get("accurate") else "NO")
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  " + "  ".join(cells))
    lines += skipped
    if report["errors"]:
        lines.append(f"  poolgate's run had {report['errors']:,} failed requests: its tokens/s and ratios omit them")
    fastest = report["fastest_accurate_peer"]
    if fastest:
        lines.append(
            f"  fastest accurate peer: {fastest} ({report['peers'][fastest]['tokens_per_s']:,.1f} tokens/s); "
            f"poolgate / it: {report['ratio_vs_fastest_accurate_peer']:.2f}x"
        )
    else:
        lines.append("  fastest accurate peer: none (no peer ran at worst cosine >= 0.999)")
    return "\n".join(lines)


def _cosine(report: dict) -> str:
    cos = report.get("cosine_to_fp32") or {}
    return _cell(cos.get("poolgate_worst"), ".6f")


def _st_cosine(report: dict) -> str:
    cos = report.get("cosine_to_fp32") or {}
    return _cell(cos.get("st_worst"), ".6f")
