"""``poolgate bench --tokenizer-only``: the gateway's input stage alone, in one process: texts/s and tokens/s.

Loads the bundled MiniLM's ``tokenizer.json`` as the gateway loads a model's
tokenizer files (``shared.inputs``: the Rust tokenizer, no torch) and runs
each request of ``--batch-size`` texts through the model's ``Front.prepare``
(checks, tokenizing with truncation to the model's 256 tokens, the int32
block the worker would receive), on 1 thread and on ``--tokenizer-threads``
threads at once, as the gateway's tokenizer pool does. What it measures is
the front door's tokenizing ceiling per gateway process, with nothing else
(HTTP, the worker) on the machine's cores.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.front import Front
from poolgate.shared.inputs.tokenizer import TextEncoder
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.messages import Input, ModelInfo, PoolingCall

MAX_LEN = 256  # the bundled MiniLM's max_model_len
INFO = ModelInfo("bundled", "BertModel", ("embed",), MAX_LEN, 384, "cpu", "float32", vocab_size=30522)


def bundled_front() -> Front:
    """The bundled model's input stage, from its tokenizer file."""
    files = TokenizerFiles((bundled_model_path() / "tokenizer.json").read_text(encoding="utf-8"))
    return Front(INFO, TextEncoder(files))


def run_tokenizer_only(texts: list[str], batch_size: int, threads: tuple[int, ...] = (1, 2)) -> dict:
    """Texts/s and tokens/s of ``Front.prepare`` over ``texts`` in calls of ``batch_size``, per thread count."""
    front = bundled_front()
    truncate = PoolingParams(truncate_prompt_tokens=-1)
    inputs: list[Input] = list(texts)
    calls = [
        PoolingCall("r", "bundled", inputs[i : i + batch_size], truncate) for i in range(0, len(texts), batch_size)
    ]
    for call in calls[:4]:  # warm up
        front.prepare(call)
    runs = []
    for n in sorted(set(threads)):
        with ThreadPoolExecutor(n) as pool:
            start = time.perf_counter()
            tokens = sum(p.total_tokens for p in pool.map(front.prepare, calls))
            wall = time.perf_counter() - start
        runs.append({"threads": n, "texts_per_s": len(texts) / wall, "tokens_per_s": tokens / wall, "wall_s": wall})
    return {"mode": "tokenizer-only", "texts": len(texts), "batch_size": batch_size, "runs": runs, "errors": 0}


def format_tokenizer_only(report: dict) -> str:
    lines = [
        f"poolgate bench --tokenizer-only: the gateway's input stage, bundled MiniLM tokenizer, {report['texts']:,} "
        f"texts in calls of {report['batch_size']}",
        f"  {'threads':>7}  {'texts/s':>10}  {'tokens/s':>12}",
    ]
    for r in report["runs"]:
        lines.append(f"  {r['threads']:>7}  {r['texts_per_s']:>10,.0f}  {r['tokens_per_s']:>12,.0f}")
    return "\n".join(lines)
