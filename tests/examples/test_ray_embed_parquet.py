"""examples/ray_embed_parquet.py run as a user runs it: a synthetic corpus through a local Ray, 2 actors."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.offline import PoolingModel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_embed_parquet.py"


@pytest.mark.slow
def test_the_example_embeds_a_synthetic_corpus_into_parquet_vectors(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'poolgate[ray]')")
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed (pip install 'poolgate[ray]')")
    corpus, vectors = tmp_path / "corpus", tmp_path / "vectors"
    args = [str(corpus), str(vectors), "--make-corpus", "600", "--actors", "2", "--dtype", "float32"]
    run = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert len(list(corpus.glob("*.parquet"))) == 3  # 250 rows a file, so both actors get blocks
    assert re.search(r"^ray start-up: [\d.]+ s$", run.stdout, re.M)
    assert re.search(r"^pipeline: 600 rows, \d+ tokens in [\d.]+ s .*: [\d.]+ rows/s, \d+ tokens/s$", run.stdout, re.M)
    table = pq.read_table(vectors).sort_by("id")
    assert table.schema.field("embeddings").type.list_size == 384
    got = np.stack(table.column("embeddings").to_numpy(zero_copy_only=False))
    with PoolingModel(dtype="float32") as reference:
        result = reference.submit(synthetic_corpus(600), PoolingParams(truncate_prompt_tokens=-1))
    want = result.outputs.values
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert table.column("id").to_pylist() == list(range(600)) and cos.min() >= 1 - 1e-5
    assert table.column("num_input_tokens").to_pylist() == result.prompt_tokens
