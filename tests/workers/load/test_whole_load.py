"""A model is loaded whole or refused: the transformers fallback names what it would drop or leave random.

The layout is the one that used to load partially (issue 16): a Stanford
ColBERT checkpoint (``HF_ColBERT``: ``bert.*`` plus ``linear.weight``) under
an architecture name poolgate does not serve natively, which transformers
loads as a BertModel, dropping the projection. Each case is refused at
start-up with the file and the tensor named; ``--allow-partial-weights``
serves it and the log says what was dropped.
"""
import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, BertModel

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.fakes import make_tiny_tokenizer


def colbert_layout(folder, architecture="ColBERTUnknownModel", change=None, **hf):
    """bert.* (no pooler, as HF_ColBERT saves it) + linear.weight (hidden → 16), config naming ``architecture``;
    returns the body and the projection."""
    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    body = BertModel(config, add_pooling_layer=False)
    state = {f"bert.{k}": v.contiguous() for k, v in body.state_dict().items()}
    state["linear.weight"] = torch.randn(16, 32)
    projection = state["linear.weight"]
    if change:
        change(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": [architecture], **hf}))
    make_tiny_tokenizer(folder)
    return body.eval(), projection


def _load(folder, **cfg):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=256, **cfg))


def test_an_unknown_layout_with_an_extra_projection_is_refused(tmp_path):
    colbert_layout(tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensors \(dropped\) linear\.weight "
                                              r"\(for BertModel; --allow-partial-weights serves it anyway\)"):
        _load(tmp_path)


def test_the_override_serves_it_and_says_what_was_dropped(tmp_path, caplog):
    colbert_layout(tmp_path)
    with caplog.at_level(logging.WARNING, logger="poolgate.worker"):
        model = _load(tmp_path, allow_partial_weights=True)
    assert model.info.embedding_dim == 32
    assert any("partial load" in r.getMessage() and "linear.weight" in r.getMessage() for r in caplog.records)


def test_a_missing_body_tensor_is_refused(tmp_path):
    colbert_layout(tmp_path, change=lambda s: (s.pop("linear.weight"), s.pop("bert.encoder.layer.0.output.dense.bias")))
    with pytest.raises(CheckpointError, match=r"missing tensors \(left random\) encoder\.layer\.0\.output\.dense\.bias"):
        _load(tmp_path)


def test_a_mis_shaped_tensor_is_refused_with_both_shapes(tmp_path):
    colbert_layout(tmp_path, change=lambda s: (s.pop("linear.weight"),
                                                s.update({"bert.embeddings.word_embeddings.weight": torch.zeros(99, 32)})))
    with pytest.raises(CheckpointError, match=r"shape mismatch \(left random\) embeddings\.word_embeddings\.weight: "
                                              r"checkpoint \(99, 32\), config expects \(100, 32\)"):
        _load(tmp_path)


def test_a_corrupt_file_is_refused_by_name(tmp_path):
    colbert_layout(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read the weights"):
        _load(tmp_path)


def test_the_base_models_pooler_may_be_missing(tmp_path):
    colbert_layout(tmp_path, change=lambda s: s.pop("linear.weight"))  # BertModel's pooler is not in the file
    assert _load(tmp_path).info.embedding_dim == 32


def test_a_head_the_poolers_read_is_not_unexpected(tmp_path):
    from transformers import AutoModelForSequenceClassification

    config = AutoConfig.for_model("electra", vocab_size=100, embedding_size=32, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, num_labels=2)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    make_tiny_tokenizer(tmp_path)
    assert set(load_file(tmp_path / "model.safetensors")) >= {"classifier.dense.weight", "classifier.out_proj.weight"}
    assert _load(tmp_path).info.tasks == ("classify", "token_classify")
