"""BGE-M3's dense, sparse and ColBERT outputs from a tiny random checkpoint in BGE-M3's layout."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.workers.load.build import load_model
from poolgate.workers.engine.cache import CachingRunner
from poolgate.workers.engine.runner_api import join_outputs
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import make_tiny_checkpoint
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 30)) + [3]]
BGE = {"architectures": ["BgeM3EmbeddingModel"]}


def _layout(folder, *, pickles: bool):
    encoder = make_tiny_checkpoint(folder, model_type="xlm-roberta")
    torch.manual_seed(1)
    sparse, colbert = torch.nn.Linear(32, 1), torch.nn.Linear(32, 32)
    for name, layer in (("sparse_linear", sparse), ("colbert_linear", colbert)):
        state = {k: v.detach().clone() for k, v in layer.state_dict().items()}
        if pickles:
            torch.save(state, folder / f"{name}.pt")
        else:
            save_file(state, str(folder / f"{name}.safetensors"))
    return encoder, sparse, colbert


def _load(folder, **kw):
    return load_model(WorkerConfig(model=str(folder), served_model_name="bge-m3", dtype="float32",
                                   max_batch_tokens=256, hf_overrides=BGE, **kw))


def _token_run(model, task):
    (run,) = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task=task)) for s in SEQS]))
    return run.rows


def test_three_outputs_match_the_reference(tmp_path):
    encoder, sparse, colbert = _layout(tmp_path, pickles=True)
    model = _load(tmp_path, allow_pickle_weights=True)
    assert model.info.tasks == ("embed", "token_embed", "token_classify")
    with torch.no_grad():
        hidden = [encoder(input_ids=torch.tensor([s])).last_hidden_state[0] for s in SEQS]  # each (T, 32)
        dense = torch.stack([torch.nn.functional.normalize(h[0], dim=-1) for h in hidden])
        weights = [torch.relu(sparse(h[1:-1])) for h in hidden]  # BOS and EOS dropped
        vectors = [torch.nn.functional.normalize(colbert(h[1:]), dim=-1) for h in hidden]  # BOS dropped
    np.testing.assert_allclose(pool_ids(model, SEQS), dense.numpy(), atol=1e-5)
    rows = _token_run(model, "token_classify")
    assert rows.offsets.tolist() == np.cumsum([0, *[len(s) - 2 for s in SEQS]]).tolist()
    for i, w in enumerate(weights):
        np.testing.assert_allclose(rows.item(i), w.numpy(), atol=1e-5)
    rows = _token_run(model, "token_embed")
    for i, v in enumerate(vectors):
        np.testing.assert_allclose(rows.item(i), v.numpy(), atol=1e-5)


def test_pickled_heads_need_the_flag_and_safetensors_heads_do_not(tmp_path):
    _layout(tmp_path / "pt", pickles=True)
    with pytest.raises(PermissionError, match="--allow-pickle-weights"):
        _load(tmp_path / "pt")
    _layout(tmp_path / "st", pickles=False)
    assert _load(tmp_path / "st").info.tasks[0] == "embed"


def _counting_forwards(folder, monkeypatch):
    """The safetensors layout loaded, and the list its runner's model appends each forward's batch to."""
    _layout(folder, pickles=False)
    model = _load(folder)
    forwards = []
    forward = model.runner.model
    monkeypatch.setattr(model.runner, "model", lambda batch: (forwards.append(batch), forward(batch))[1])
    return model, forwards


def test_one_multi_output_run_is_one_forward_equal_to_three_runs(tmp_path, monkeypatch):
    model, forwards = _counting_forwards(tmp_path, monkeypatch)
    asked = [PoolingParams(), PoolingParams(task="token_classify"), PoolingParams(task="token_embed")]
    alone = [_token_run(model, p.task) for p in asked]
    per_run = len(forwards) // len(asked)  # 1, or one per CPU lane the batch was cut into
    assert per_run * len(asked) == len(forwards)
    forwards.clear()
    multi = replace(asked[0], outputs=tuple(asked[1:]))
    outputs = join_outputs(model.runner.execute(model.runner.prepare([Sequence(s, multi) for s in SEQS])))
    assert len(forwards) == per_run
    assert outputs[0].start == 0 and outputs[-1].stop == len(SEQS) and all(len(o.more) == 2 for o in outputs)
    for k, rows in enumerate(alone):
        got = Rows.concat([(o.rows, *o.more)[k] for o in outputs])
        np.testing.assert_array_equal(got.values, rows.values)  # bit for bit: the same hidden states
        assert (got.offsets is None) == (rows.offsets is None)
        if got.offsets is not None:
            np.testing.assert_array_equal(got.offsets, rows.offsets)


def test_the_embedding_cache_answers_a_multi_output_run_as_its_miss_did(tmp_path, monkeypatch):
    model, forwards = _counting_forwards(tmp_path, monkeypatch)
    cache = CachingRunner(model.runner, 1 << 20)
    multi = PoolingParams(outputs=(PoolingParams(task="token_classify"), PoolingParams(task="token_embed")))
    seqs = [Sequence(s, multi) for s in SEQS]
    miss = join_outputs(cache.execute(cache.prepare(seqs)))
    ran = len(forwards)
    hit = join_outputs(cache.execute(cache.prepare(seqs)))
    assert len(forwards) == ran and cache.stats()["hits"] == len(SEQS)
    assert [len(o.more) for o in hit] == [2] * len(SEQS)
    for a, b in zip(miss, hit):
        for x, y in zip((a.rows, *a.more), (b.rows, *b.more)):
            np.testing.assert_array_equal(x.values, y.values)
    single = join_outputs(cache.execute(cache.prepare([Sequence(s, PoolingParams()) for s in SEQS])))
    assert len(forwards) > ran and all(not o.more for o in single)  # a dense-only call is its own entry
