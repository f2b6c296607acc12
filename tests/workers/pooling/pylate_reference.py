"""PyLate's own answer for a tiny ColBERT folder, run in PyLate's venv (``.cache/pylate-venv``), never imported by pytest.

``python pylate_reference.py BASE FOLDER OUT SETTINGS_JSON``: builds a PyLate
ColBERT from the tiny transformers checkpoint in BASE (PyLate adds its
markers to the tokenizer and a random Dense projection), saves it to FOLDER
as PyLate ships models, loads FOLDER back, and writes into OUT what PyLate's
``encode`` gives: ``q{i}.npy`` / ``d{i}.npy`` token vectors of each query and
document and ``scores.npy`` (queries × documents, ``pylate.scores.colbert_scores`` per pair).
SETTINGS_JSON holds the ColBERT settings, ``queries`` and ``documents``.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from pylate import models, scores


def main(base: str, folder: str, out: str, settings: str) -> None:
    cfg = json.loads(settings)
    queries, documents, seed = cfg.pop("queries"), cfg.pop("documents"), cfg.pop("seed", 0)
    torch.manual_seed(seed)
    models.ColBERT(model_name_or_path=base, device="cpu", **cfg).save(folder)
    model = models.ColBERT(model_name_or_path=folder, device="cpu")
    q = model.encode(queries, is_query=True, batch_size=2)  # per query: (query_length, dim)
    d = model.encode(documents, is_query=False, batch_size=2)  # per document: (kept tokens, dim)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    for name, vectors in (("q", q), ("d", d)):
        for i, v in enumerate(vectors):
            np.save(target / f"{name}{i}.npy", np.asarray(v, dtype=np.float32))
    pair = [[float(scores.colbert_scores(torch.from_numpy(a)[None], torch.from_numpy(b)[None])[0, 0]) for b in d]
            for a in q]  # one pair at a time: the documents differ in length
    np.save(target / "scores.npy", np.asarray(pair, dtype=np.float32))


if __name__ == "__main__":
    main(*sys.argv[1:5])
