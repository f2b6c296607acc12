"""The in-process sentence-transformers baseline that ``poolgate bench`` compares against.

Encodes the benchmark corpus with ``SentenceTransformer.encode`` after a short
warm-up and times only the encode calls (time.perf_counter). Tokens are counted
with the model's own tokenizer under its ``max_seq_length`` truncation, the
count an OpenAI-style server reports as ``usage.prompt_tokens``. torch and
sentence-transformers are imported inside the function, so importing this
module stays cheap.
"""
from __future__ import annotations

import time

from poolgate.shared.config.model_settings import DTYPE_CHOICES

DTYPES = DTYPE_CHOICES[1:]  # every explicit dtype; "auto" is poolgate's own rule


def count_tokens(tokenizer, texts: list[str], max_length: int) -> int:
    """Tokens per text with special tokens, truncated to ``max_length``, summed."""
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    return sum(len(x) for x in ids)


def run_reference(texts: list[str], *, model_path: str, passes: int = 1, batch_size: int = 32,
                  device: str = "cpu", dtype: str = "float32", warmup_texts: int = 64,
                  vectors_out: list | None = None) -> dict:
    """Encode ``texts`` ``passes`` times; return counts, wall time and rates (the last pass's (n, dim) float32
    vectors appended to ``vectors_out`` when given)."""
    import torch
    from sentence_transformers import SentenceTransformer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    model = SentenceTransformer(model_path, device=device)
    model.to(getattr(torch, dtype))
    model.eval()
    max_len = int(model.max_seq_length)
    model.encode(texts[:warmup_texts], batch_size=batch_size, show_progress_bar=False)
    tokens = count_tokens(model.tokenizer, texts, max_len) * passes
    dim = None
    start = time.perf_counter()
    for _ in range(passes):
        vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=False)  # (n, dim)
        dim = int(vectors.shape[1])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if vectors_out is not None:
        vectors_out.append(vectors.astype("float32"))
    return {
        "model_path": str(model_path), "device": device, "dtype": dtype, "batch_size": batch_size,
        "max_seq_length": max_len, "passes": passes, "inputs": len(texts) * passes,
        "prompt_tokens": tokens, "embedding_dim": dim, "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "inputs_per_s": len(texts) * passes / wall if wall > 0 else 0.0,
    }
