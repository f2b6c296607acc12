"""The runner alone, in-process: a model folder's forward + pooling on packed token-budget batches, no HTTP.

The synthetic corpus (``shared.domain.corpus``) is tokenized by the model's own
tokenizer and cut into FIFO batches of the token budget, as the scheduler cuts
them under load; after one untimed warm-up pass over the first batch, every
batch is prepared up front and ``execute`` (forward, pooling, copy back) is
timed over all of them (with ``cuda_graphs``, the warm-up runs every batch once,
so capture is not timed), then ``prepare`` + ``execute`` together, one batch
after the other (what one engine thread pair does without overlap). A JSON-able
report: tokens/s of each, the backend, dtype, attention and device; the linear
layers' GFLOP/s over ``execute`` against the GEMM peak measured on the same
core threads, and attention's share of a one-thread forward (``runner_shares``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.bench_arch import batches
from poolgate.workers.tools.runner_shares import attention_share, gemm_peak, linear_flops

ATTENTION_BATCHES = 8  # batches the one-thread attention-share pass runs


@dataclass(frozen=True)
class RunnerBench:
    model_path: str
    backend: str = "auto"
    dtype: str = "auto"
    num_texts: int = 2048
    seed: int = 0
    max_batch_tokens: int | None = None
    max_model_len: int | None = None
    passes: int = 1
    cuda_graphs: bool = False


def run_runner_bench(cfg: RunnerBench) -> dict:
    model = load_model(WorkerConfig(model=cfg.model_path, served_model_name="bench", backend=cfg.backend,
                                    dtype=cfg.dtype, max_batch_tokens=cfg.max_batch_tokens,
                                    max_model_len=cfg.max_model_len, cuda_graphs=cfg.cuda_graphs))
    runner, info = model.runner, model.info
    params = PoolingParams(task=info.tasks[0])
    ids = model.encoder.encode(synthetic_corpus(cfg.num_texts, cfg.seed), max_tokens=info.max_model_len)
    work = [[Sequence(s, params) for s in b] for b in batches(ids, model.max_batch_tokens)] * cfg.passes
    tokens = sum(len(s) for s in ids) * cfg.passes
    for b in work if runner.graphs is not None else work[:1]:  # warm-up (kernel choice, caches; graphs captured)
        runner.execute(runner.prepare(b))
    prepared = [runner.prepare(b) for b in work]
    runner.backend.synchronize()
    start = time.perf_counter()
    for p in prepared:
        runner.execute(p)  # copies results to the host, so the device is done when it returns
    execute_s = time.perf_counter() - start
    del prepared
    start = time.perf_counter()
    for b in work:
        runner.execute(runner.prepare(b))
    both_s = time.perf_counter() - start
    sync = runner.backend.synchronize
    flops = linear_flops(runner.model)
    peak = gemm_peak(runner.backend.device(), runner.dtype, runner.core_threads.n if runner.core_threads else 1, sync)
    linear_gflops = tokens * flops / execute_s / 1e9
    inputs = []
    for b in work[:ATTENTION_BATCHES]:
        p = runner._prepare_part(b)
        inputs.append(p.packed if p.model_input is None else p.model_input)
    share = attention_share(runner.model, inputs, sync)
    return {
        "model_path": cfg.model_path, "architecture": info.architecture, "backend": info.backend,
        "device": info.device, "device_name": info.device_name, "dtype": info.dtype, "attention": info.attention,
        "texts": len(ids), "passes": cfg.passes, "tokens": tokens, "batches": len(work),
        "max_batch_tokens": model.max_batch_tokens, "execute_s": round(execute_s, 4),
        "execute_tokens_per_s": round(tokens / execute_s, 1), "prepare_execute_s": round(both_s, 4),
        "tokens_per_s": round(tokens / both_s, 1),
        "linear_flops_per_token": flops, "linear_gflops": round(linear_gflops, 1), "gemm_peak": peak,
        "gemm_peak_share": round(linear_gflops / peak["float_gflops"], 3) if peak.get("float_gflops") else None,
        "attention_share": None if share is None else round(share, 3),
        "cuda_graphs": info.kernels.get("cuda_graphs", "off"),
        "graphs_captured": 0 if runner.graphs is None else len(runner.graphs.graphs),
    }
