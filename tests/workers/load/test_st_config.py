"""Reading sentence-transformers files: pooling, Normalize, Dense, max length, precedence."""
import json

import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.load.checkpoint import Checkpoint


def _folder(tmp_path, *, pooling=None, normalize=True, max_seq_length=None, dense=False, hf=None):
    (tmp_path / "config.json").write_text(json.dumps(
        hf or {"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 512}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    if pooling:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    if dense:
        (tmp_path / "2_Dense").mkdir()
        (tmp_path / "2_Dense" / "config.json").write_text(json.dumps(
            {"in_features": 8, "out_features": 4, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}))
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    if normalize:
        modules.append({"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if max_seq_length:
        (tmp_path / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": True}))
    return tmp_path


def _spec(folder, pooling_type=None, normalize=None, **flags):
    """read_spec with the --pooling-type / --no-normalize aliases as the CLI folds them in."""
    pooler = PoolerConfig(seq_pooling_type=pooling_type, use_activation=normalize)
    return read_spec(WorkerConfig(model=str(folder), served_model_name="m", pooler_config=pooler, **flags))


@pytest.mark.parametrize("cfg,want", [
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "MEAN"),
    ({"pooling_mode_cls_token": True}, "CLS"),
    ({"pooling_mode_lasttoken": True}, "LAST"),
    ({"pooling_mode": "cls"}, "CLS"),
])
def test_pooling_mode(tmp_path, cfg, want):
    assert _spec(_folder(tmp_path, pooling=cfg)).pooling_type == want


@pytest.mark.parametrize("cfg", [
    {"pooling_mode_max_tokens": True},
    {"pooling_mode_weightedmean_tokens": True},
    {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
])
def test_unsupported_pooling_is_an_error_unless_overridden(tmp_path, cfg):
    folder = _folder(tmp_path, pooling=cfg)
    with pytest.raises(ValueError, match="not supported"):
        _spec(folder)
    assert _spec(folder, pooling_type="mean").pooling_type == "MEAN"


def test_pooling_names_agree():
    from poolgate.shared.config.model_settings import SEQ_POOLING_TYPES
    from poolgate.workers.pooling.methods import POOLING_TYPES, TOKEN_POOLING_TYPES

    assert tuple(t for t in POOLING_TYPES if t not in TOKEN_POOLING_TYPES) == SEQ_POOLING_TYPES


def test_normalize_dense_and_lengths(tmp_path):
    spec = _spec(_folder(tmp_path, pooling={"pooling_mode_cls_token": True}, max_seq_length=128, dense=True))
    assert spec.normalize is True and spec.max_model_len == 128 and spec.do_lower_case
    assert [(d.in_features, d.out_features) for d in spec.dense] == [(8, 4)]


def test_precedence_flag_over_st_over_default(tmp_path):
    folder = _folder(tmp_path, pooling={"pooling_mode_mean_tokens": True}, normalize=False, max_seq_length=128)
    spec = _spec(folder)
    assert (spec.pooling_type, spec.normalize, spec.max_model_len) == ("MEAN", False, 128)
    spec = _spec(folder, pooling_type="cls", normalize=True, max_model_len=300)
    assert (spec.pooling_type, spec.normalize, spec.max_model_len) == ("CLS", True, 300)
    with pytest.raises(ValueError, match="exceeds"):
        _spec(folder, max_model_len=1000)


def test_plain_hf_folder_uses_architecture_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "max_position_embeddings": 514,
         "pad_token_id": 1, "matryoshka_dimensions": [64, 128]}))
    spec = _spec(tmp_path)
    assert spec.pooling_type is None and spec.normalize is None and spec.max_model_len == 512
    assert spec.is_matryoshka and spec.matryoshka_dimensions == (64, 128)


def test_pickle_weights_need_the_flag(tmp_path):
    import torch

    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(PermissionError, match="allow-pickle-weights"):
        Checkpoint.open(tmp_path)
    assert Checkpoint.open(tmp_path, allow_pickle=True)["w"].tolist() == [1.0, 1.0]
