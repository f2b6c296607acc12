"""A loaded model pools with its backend's ops bundle: a tiny BERT embedder loaded on the CPU backend, once with
its own bundle (the torch references) and once with ``triton_pooling`` put into it (as the GPU backends do), gives
the same vectors for MEAN embed with a matryoshka cut and STEP token_embed, in Triton's interpreter."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, BertModel

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.kernels.gpu import normalize, pool
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_tokenizer

TAG = 7


def _bert(folder) -> None:
    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in BertModel(config, add_pooling_layer=False).state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": ["BertModel"]}))
    make_tiny_tokenizer(folder)


def _outputs(model) -> list[np.ndarray]:
    ids = [[2, 11, TAG, 12, 3], [2, 3], [2, TAG, 40, 41, TAG, 42, 3]]
    runs = [PoolingParams(task="embed"), PoolingParams(task="embed", dimensions=8),
            PoolingParams(task="token_embed")]
    out = []
    for params in runs:
        for o in model.runner.run([Sequence(x, params) for x in ids]):
            out += [o.rows.values] + ([] if o.rows.offsets is None else [o.rows.offsets])
    return out


def test_a_loaded_model_pools_with_its_backends_bundle(tmp_path, monkeypatch):
    _bert(tmp_path)
    # num_threads: each batch whole, on one team (Triton's interpreter runs one kernel at a time per process,
    # so the CPU's core threads, which pool the parts of a batch at once, would clobber each other's grid)
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32", max_batch_tokens=64,
                       num_threads=1, pooler_config=PoolerConfig(seq_pooling_type="MEAN", tok_pooling_type="STEP",
                                                                 step_tag_id=TAG))
    want = load_model(cfg)
    cpu_ops = CpuBackend.ops
    monkeypatch.setattr(CpuBackend, "ops", lambda self, dtype: pool.triton_pooling(cpu_ops(self, dtype)))
    got = load_model(cfg)
    pooler = got.runner.pooler
    assert pooler.ops.kept_rows is pool.kept_rows and pooler.ops.pooling["MEAN"] is pool.mean_pool
    assert all(p.head.l2_cut is normalize.l2_cut for p in pooler.poolers.values())
    assert want.runner.pooler.ops.kept_rows is not pool.kept_rows
    a, b = _outputs(got), _outputs(want)
    assert [x.shape for x in a] == [x.shape for x in b] and a[1].shape == (3, 8)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _threads():
    """The load sets torch's threads (num_threads=1); the tests after this one get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
