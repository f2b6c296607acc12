"""Cross-encoder scores vs transformers: ``python -m tests.workers.score_agreement`` prints the figure.

A tiny random BERT cross-encoder (one label; token type 1 on each pair's
second text) is served by poolgate's worker (its packed BERT, or the
transformers fallback with ``--fallback``) and scored by transformers' own
``BertForSequenceClassification`` on the same folder, ``sigmoid(logit)`` of
``tokenizer(query, text_pair=document)``. The figure is the largest absolute
difference over ``PAIRS`` (30 query/document pairs, 1:N and N:N).
"""
from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from tests.fakes import make_tiny_cross_encoder

random.seed(7)
QUERIES = [" ".join(f"w{random.randrange(95)}" for _ in range(random.randint(1, 8))) for _ in range(15)]
DOCUMENTS = [" ".join(f"w{random.randrange(95)}" for _ in range(random.randint(1, 30))) for _ in range(30)]
PAIRS = [(QUERIES[0], d) for d in DOCUMENTS[:15]] + list(zip(QUERIES, DOCUMENTS[15:]))  # 15 1:N + 15 N:N


def reference_scores(folder: Path, pairs: list[tuple[str, str]], model=None) -> np.ndarray:
    """transformers' sigmoid(logit) for each pair, one forward per pair."""
    from transformers import AutoModelForSequenceClassification

    model = model or AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        logits = [model(**tokenizer(q, text_pair=d, return_tensors="pt")).logits[0, 0] for q, d in pairs]
    return torch.sigmoid(torch.stack(logits)).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fallback", action="store_true", help="serve with the transformers fallback")
    args = parser.parse_args()
    from poolgate.workers.offline import PoolingModel

    with tempfile.TemporaryDirectory() as tmp:
        make_tiny_cross_encoder(tmp)
        want = reference_scores(Path(tmp), PAIRS)
        if args.fallback:  # no packed BERT classifier: transformers' AutoModel, padded
            from poolgate.workers.models import ARCHITECTURES

            del ARCHITECTURES["BertForSequenceClassification"]
        with PoolingModel(tmp, dtype="float32") as model:
            one_to_n = model.score(PAIRS[0][0], [d for _, d in PAIRS[:15]])
            pairwise = model.score([q for q, _ in PAIRS[15:]], [d for _, d in PAIRS[15:]])
        got = np.concatenate([one_to_n, pairwise])
        print(f"cross-encoder vs transformers, {len(PAIRS)} pairs, fp32: max |diff| = {np.abs(got - want).max():.2e}")


if __name__ == "__main__":
    main()
