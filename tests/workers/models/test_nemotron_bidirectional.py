"""nvidia llama-nemotron embed / rerank (``LlamaBidirectionalModel`` / ``...ForSequenceClassification``, model_type
``llama_bidirec``, the checkpoint's own code) served by the packed Llama, against that code's computation
re-created in transformers: a LlamaModel without the causal mask, pooled by the config's ``pooling`` (avg → mean),
the classifier's ``score`` logits divided by ``temperature``."""
import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from tests.workers.models.test_decoder_golden import SEQS, save_tiny
from tests.workers.pooled import pool_ids

NEMOTRON = {"model_type": "llama_bidirec", "pooling": "avg", "temperature": 1.0,
            "auto_map": {"AutoConfig": "llama_bidirectional_model.LlamaBidirectionalConfig",
                         "AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel"}}


def _as_nemotron(folder, architecture: str, **hf):
    """Rewrite a saved Llama's config.json the way nemotron ships it (its own model type and code)."""
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k != "is_causal"}
    (folder / "config.json").write_text(json.dumps({**config, **NEMOTRON, "architectures": [architecture], **hf}))


def _load(folder):
    return load_model(WorkerConfig(model=str(folder), served_model_name="n", dtype="float32",
                                   max_batch_tokens=1024))


def _mean(ref, seqs):
    with torch.no_grad():
        return [ref(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0) for s in seqs]


def test_the_embedder_is_bidirectional_and_mean_pooled(tmp_path):
    ref = save_tiny(tmp_path, "llama", "LlamaModel", is_causal=False)
    _as_nemotron(tmp_path, "LlamaBidirectionalModel")
    model = _load(tmp_path)
    assert model.info.tasks == ("embed", "token_embed") and model.runner.model.__class__.__name__ == "PackedDecoder"
    want = torch.stack([torch.nn.functional.normalize(v, dim=-1) for v in _mean(ref, SEQS)]).numpy()
    got = pool_ids(model, SEQS)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() > 0.99999 and np.abs(got - want).max() < 1e-5, (cos.min(), np.abs(got - want).max())


def test_the_reranker_divides_its_logits_by_the_temperature(tmp_path):
    ref = save_tiny(tmp_path, "llama", "LlamaForSequenceClassification", auto=AutoModelForSequenceClassification,
                    is_causal=False, num_labels=1)
    _as_nemotron(tmp_path, "LlamaBidirectionalForSequenceClassification", temperature=2.0)
    model = _load(tmp_path)
    assert model.info.tasks == ("classify", "token_classify")
    with torch.no_grad():
        logits = torch.stack([ref.score(v) for v in _mean(ref.model, SEQS)]) / 2.0  # (n, 1)
    got = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, torch.sigmoid(logits).numpy(), atol=1e-5)


def test_a_pooling_it_does_not_run_is_refused(tmp_path):
    save_tiny(tmp_path, "llama", "LlamaModel", is_causal=False)
    _as_nemotron(tmp_path, "LlamaBidirectionalModel", pooling="weighted_avg")
    with pytest.raises(ValueError, match=r"pooling 'weighted_avg' is not one poolgate runs for llama_bidirec"):
        _load(tmp_path)


def test_its_auto_map_is_never_asked_about_on_stdin(tmp_path, monkeypatch):
    import builtins

    save_tiny(tmp_path, "llama", "LlamaModel", is_causal=False)
    _as_nemotron(tmp_path, "LlamaBidirectionalModel")
    monkeypatch.setattr(builtins, "input", lambda *a, **k: pytest.fail("transformers asked about remote code"))
    assert _load(tmp_path).info.tasks[0] == "embed"
