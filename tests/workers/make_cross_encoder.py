"""Write a cross-encoder folder for benchmarks: ``python -m tests.workers.make_cross_encoder DIR [--shape S]``.

``--shape tiny`` (default): ``tests.fakes.make_tiny_cross_encoder``, a 2-layer,
32-wide random BERT with one label. ``--shape minilm``: the bundled
all-MiniLM-L6-v2 encoder with a freshly initialised one-label head (seed 0), a
``BertForSequenceClassification`` of the shape of cross-encoder/ms-marco-MiniLM-L-6-v2
(6 layers, 384 wide), with MiniLM's tokenizer. Neither is a trained reranker:
they exist to time the cross-encoder path (``poolgate bench-rerank``).
"""
from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from poolgate.shared.config.models import bundled_model_path
from tests.fakes import make_tiny_cross_encoder


def minilm_cross_encoder(folder: str) -> None:
    torch.manual_seed(0)
    source = str(bundled_model_path())
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1).eval()
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)


SHAPES = {"tiny": make_tiny_cross_encoder, "minilm": minilm_cross_encoder}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = parser.parse_args()
    SHAPES[args.shape](args.folder)
    print(f"wrote a {args.shape} cross-encoder to {args.folder}")


if __name__ == "__main__":
    main()
