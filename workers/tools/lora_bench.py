"""Run-time LoRA adapters' cost on the runner alone: tokens/s with the base model, one adapter, and four mixed.

Random rank-``rank`` PEFT LoRA adapters (``adapter_config.json`` + ``adapter_model.safetensors``, B non-zero) on
every linear a packed model runs unfused with its activation (``targets``: BERT's Q/K/V, attention output and
output dense; a decoder's q/k/v/o and gate/up/down) are written to a temporary folder and loaded with
``--max-loras 4`` (``workers.models.run_loras``). The synthetic corpus runs in FIFO token-budget batches three
ways: every sequence on the base model, every sequence on adapter 0, and sequence i on adapter i % 4 (four
adapters in every batch: segment LoRA). Each way's figure is the best of ``repeats`` timed ``execute`` passes over
batches prepared up front (the ways take turns), after one untimed warm-up batch; so is the
figure per second of the process's CPU time, which a neighbour's load on a shared machine disturbs less.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.bench_arch import batches

ADAPTERS = 4


@dataclass(frozen=True)
class LoraBench:
    model_path: str
    dtype: str = "float32"
    rank: int = 16
    num_texts: int = 256
    seed: int = 0
    max_batch_tokens: int | None = None
    max_model_len: int | None = None
    repeats: int = 3


def targets(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Checkpoint weight name → shape, for every linear the packed model runs without a fused activation."""
    out = {}
    for ours, found in model.checkpoint_names.items():
        if not ours.endswith(".weight"):
            continue
        module = model.get_submodule(ours.removesuffix(".weight"))
        if isinstance(module, torch.nn.Embedding) or getattr(module, "activation", "none") != "none":
            continue
        out.update({f: model.checkpoint_shapes[f] for f in found
                    if len(model.checkpoint_shapes[f]) == 2 and "embed" not in f})
    return out


def write_adapter(folder: Path, shapes: dict[str, tuple[int, ...]], rank: int, seed: int) -> None:
    """A random PEFT LoRA adapter of ``rank`` on ``shapes``' weights, in ``folder``."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out, inp) in shapes.items():
        key = "base_model.model." + name.removesuffix(".weight")
        tensors[key + ".lora_A.weight"] = torch.randn(rank, inp, generator=g) * inp ** -0.5
        tensors[key + ".lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    leaves = sorted({n.removesuffix(".weight").rsplit(".", 1)[-1] for n in shapes})
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": leaves, "bias": "none"}))


def run_lora_bench(cfg: LoraBench) -> dict:
    model = load_model(WorkerConfig(model=cfg.model_path, served_model_name="bench", dtype=cfg.dtype,
                                    max_batch_tokens=cfg.max_batch_tokens, max_model_len=cfg.max_model_len,
                                    max_loras=ADAPTERS, max_lora_rank=cfg.rank))
    runner, info = model.runner, model.info
    shapes = targets(runner.model)
    with tempfile.TemporaryDirectory(prefix="poolgate-lora-bench-") as tmp:
        for i in range(ADAPTERS):
            write_adapter(Path(tmp) / f"a{i}", shapes, cfg.rank, cfg.seed + i)
            runner.adapters.load(f"a{i}", Path(tmp) / f"a{i}")
    ids = model.encoder.encode(synthetic_corpus(cfg.num_texts, cfg.seed), max_tokens=info.max_model_len)
    cut = batches(ids, model.max_batch_tokens)
    tokens = sum(len(s) for s in ids)
    task = info.tasks[0]
    ways = {"base": lambda i: None, "one_adapter": lambda i: "a0", "four_mixed": lambda i: f"a{i % ADAPTERS}"}
    work = {way: [] for way in ways}
    for way, lora in ways.items():
        i = 0
        for b in cut:
            work[way].append([Sequence(s, PoolingParams(task=task, lora=lora(i + k))) for k, s in enumerate(b)])
            i += len(b)
        runner.execute(runner.prepare(work[way][0]))  # warm-up
    best = {way: float("inf") for way in ways}
    best_cpu = dict(best)
    for _ in range(cfg.repeats):  # the ways take turns, so a neighbour's load on a shared machine hits each alike
        for way in ways:
            prepared = [runner.prepare(b) for b in work[way]]
            runner.backend.synchronize()
            start, cpu = time.perf_counter(), time.process_time()
            for p in prepared:
                runner.execute(p)
            best[way] = min(best[way], time.perf_counter() - start)
            best_cpu[way] = min(best_cpu[way], time.process_time() - cpu)
    figures = {way: round(tokens / s, 1) for way, s in best.items()}
    per_cpu = {way: round(tokens / s, 1) for way, s in best_cpu.items()}
    return {
        "model_path": cfg.model_path, "architecture": info.architecture, "device_name": info.device_name,
        "dtype": info.dtype, "rank": cfg.rank, "targets": len(shapes), "texts": len(ids), "tokens": tokens,
        "batches": len(cut), "max_batch_tokens": model.max_batch_tokens, "tokens_per_s": figures,
        "overhead": {w: round(1 - figures[w] / figures["base"], 3) for w in ("one_adapter", "four_mixed")},
        # per second of the process's CPU time (all its threads): steadier than the wall clock on a shared machine
        "tokens_per_cpu_s": per_cpu,
        "cpu_overhead": {w: round(1 - per_cpu[w] / per_cpu["base"], 3) for w in ("one_adapter", "four_mixed")},
    }
