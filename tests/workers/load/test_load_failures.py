"""Checkpoints poolgate cannot load stop start-up with a message naming the file and the problem."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.models.hf_auto import check_supported
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.load.weights import CheckpointError
from tests.workers.encoder_families import save_tiny


def _load(folder, **cfg):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=256, **cfg))


def _rewrite(folder, change):
    path = folder / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path, metadata={"format": "pt"})


def _refused(folder, model_type, change, match) -> CheckpointError:
    """A tiny ``model_type`` checkpoint with ``change`` applied to its tensors fails to load with ``match``."""
    save_tiny(folder, model_type)
    _rewrite(folder, change)
    with pytest.raises(CheckpointError, match=match) as e:
        _load(folder)
    return e.value


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "mpnet"])
def test_missing_tensor(tmp_path, model_type):
    def drop_a_layer_1_tensor(state):
        state.pop(next(k for k in state if k.endswith(("layer.1.output.dense.weight", "layer.1.ffn.lin2.weight"))))

    err = _refused(tmp_path, model_type, drop_a_layer_1_tensor, r"model\.safetensors: missing tensors \S*layer\.1\.")
    assert str(tmp_path / "model.safetensors") in str(err)


def test_unexpected_tensor(tmp_path):
    _refused(tmp_path, "bert", lambda s: s.update({"encoder.layer.7.attention.self.query.weight": torch.zeros(2, 2)}),
             r"model\.safetensors: unexpected tensors encoder\.layer\.7\.")


def test_head_tensors_and_saved_buffers_are_not_unexpected(tmp_path):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=2)
    _rewrite(tmp_path, lambda s: s.update({"bert.embeddings.position_ids": torch.arange(66)[None]}))
    assert _load(tmp_path).info.tasks == ("classify", "token_classify")


def test_shape_mismatch_names_both_shapes(tmp_path):
    _refused(tmp_path, "roberta", lambda s: s.update({"embeddings.position_embeddings.weight": torch.zeros(40, 32)}),
             r"model\.safetensors: shape mismatch: embeddings\.position_embeddings\.weight: checkpoint \(40, 32\), "
             r"config expects \(66, 32\)")


def test_fused_qkv_shape_mismatch(tmp_path):
    _refused(tmp_path, "mpnet", lambda s: s.update({"encoder.layer.0.attention.attn.k.weight": torch.zeros(16, 32)}),
             r"shape mismatch: .*attn\.q\.weight\+.*attn\.k\.weight")


def test_pickle_without_the_flag_names_the_file(tmp_path):
    ref = save_tiny(tmp_path, "bert")
    (tmp_path / "model.safetensors").unlink()
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(PermissionError, match=r"pytorch_model\.bin: pickle weights .*--allow-pickle-weights") as e:
        _load(tmp_path)
    assert str(tmp_path / "pytorch_model.bin") in str(e.value)
    assert _load(tmp_path, allow_pickle_weights=True).info.embedding_dim == 32


def test_pickle_without_the_flag_in_the_fallback(tmp_path):
    from transformers import AutoConfig, AutoModel

    from tests.fakes import make_tiny_tokenizer

    config = AutoConfig.for_model("electra", vocab_size=100, embedding_size=32, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    ref = AutoModel.from_config(config)
    ref.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    make_tiny_tokenizer(tmp_path)
    with pytest.raises(PermissionError, match=r"pytorch_model\.bin: pickle weights .*--allow-pickle-weights"):
        _load(tmp_path)
    assert _load(tmp_path, allow_pickle_weights=True).info.embedding_dim == 32


def test_corrupt_weights_file_is_named(tmp_path):
    save_tiny(tmp_path, "bert")
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read the weights"):
        _load(tmp_path)


def test_missing_tensor_in_the_fallback(tmp_path):
    from transformers import AutoConfig, AutoModel

    from tests.fakes import make_tiny_tokenizer

    config = AutoConfig.for_model("electra", vocab_size=100, embedding_size=32, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    AutoModel.from_config(config).save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    _rewrite(tmp_path, lambda s: s.pop("encoder.layer.0.output.dense.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensors \(left random\) encoder\.layer\.0\.output\.dense"):
        _load(tmp_path)


def _config_only(folder, **hf):
    import json

    from tests.fakes import make_tiny_tokenizer

    (folder / "config.json").write_text(json.dumps(hf))
    make_tiny_tokenizer(folder)


def test_unknown_architecture(tmp_path):
    _config_only(tmp_path, architectures=["FrobnicatorModel"], model_type="frobnicator", hidden_size=8)
    with pytest.raises(CheckpointError, match=r"config\.json: unknown architecture FrobnicatorModel \(model_type "
                                              r"'frobnicator'\): poolgate has no packed implementation"):
        _load(tmp_path)


def test_remote_code_needs_the_flag(tmp_path):
    _config_only(tmp_path, architectures=["FrobnicatorModel"], model_type="frobnicator",
                 auto_map={"AutoConfig": "frob.FrobConfig", "AutoModel": "frob.FrobnicatorModel"})
    spec = read_spec(WorkerConfig(model=str(tmp_path), served_model_name="t"))
    with pytest.raises(CheckpointError, match=r"config\.json: .*needs the checkpoint's own code \(frob\."
                                              r"FrobnicatorModel\); pass --trust-remote-code"):
        check_supported(spec, trust_remote_code=False)
    check_supported(spec, trust_remote_code=True)  # allowed: transformers then imports frob.py from the folder


def test_trust_remote_code_flag_reaches_the_worker_config():
    import argparse

    from poolgate.shared.config.model_flags import add_model_arguments, worker_config_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_model_arguments(parser)
    assert not worker_config_from_args(parser.parse_args(["."])).trust_remote_code
    assert worker_config_from_args(parser.parse_args([".", "--trust-remote-code"])).trust_remote_code
