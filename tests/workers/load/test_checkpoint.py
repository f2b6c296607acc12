"""The one checkpoint handle: tensors equal safetensors' own reader, each read once per load, bad files named."""
import collections
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.checkpoint import Checkpoint, InMemory, find_name, strip_prefix
from poolgate.workers.load.safetensors_file import SafetensorsFile
from poolgate.workers.load.weights import CheckpointError
from tests.workers.encoder_families import save_tiny


def test_tensors_and_shapes_equal_the_reference_reader(tmp_path):
    state = {"bert.a": torch.randn(3, 4).bfloat16(), "bert.b": torch.arange(5), "c": torch.zeros(0, 3),
             "d": torch.randn(2, 2).half(), "e": torch.tensor([True, False]), "f": torch.randn(7, dtype=torch.float64)}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ref, handle = load_file(tmp_path / "model.safetensors"), Checkpoint.open(tmp_path)
    assert set(handle) == set(ref)
    for name, want in ref.items():
        got = handle[name]
        assert handle.shape(name) == tuple(want.shape) and got.dtype == want.dtype and torch.equal(got, want)
    view = strip_prefix(handle, ("roberta.", "bert."))
    assert set(view) == {"a", "b", "c", "d", "e", "f"} and view.shape("a") == (3, 4)
    assert torch.equal(view["b"], torch.arange(5))
    handle.close()


def test_shards_are_read_through_the_index(tmp_path):
    save_file({"x": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"y": torch.zeros(3)}, tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    handle = Checkpoint.open(tmp_path)
    assert handle["x"].tolist() == [1, 1] and handle.shape("y") == (3,)
    assert handle.source == str(tmp_path / "model.safetensors.index.json")


@pytest.mark.parametrize("cut", [4, 20, 60])
def test_a_truncated_file_is_refused_by_name_at_open(tmp_path, cut):
    save_file({"w": torch.randn(4, 4)}, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-cut] if cut < 60 else data[:cut])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read the weights"):
        Checkpoint.open(tmp_path)


def test_offsets_that_do_not_hold_the_tensor_are_refused(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(CheckpointError, match=r"tensor w: offsets 0\.\.8 do not hold F32\[4\]"):
        Checkpoint.open(tmp_path)


def test_legacy_layer_norm_names_are_found_once_for_every_reader():
    state = InMemory({"encoder.LayerNorm.gamma": torch.ones(2), "dense.weight": torch.ones(2)}, "x")
    assert find_name(state, "encoder.LayerNorm.weight") == "encoder.LayerNorm.gamma"
    assert find_name(state, "dense.weight") == "dense.weight" and find_name(state, "dense.bias") is None


def _counting(monkeypatch):
    """Counts of weights files opened and of tensors read (by name) while loading."""
    opened, reads = collections.Counter(), collections.Counter()
    init, get = SafetensorsFile.__init__, SafetensorsFile.get_tensor

    def counted_init(self, path):
        opened[str(path)] += 1
        init(self, path)

    def counted_get(self, name):
        reads[name] += 1
        return get(self, name)

    monkeypatch.setattr(SafetensorsFile, "__init__", counted_init)
    monkeypatch.setattr(SafetensorsFile, "get_tensor", counted_get)
    return opened, reads


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_classifier_is_opened_once_and_each_tensor_read_once(tmp_path, monkeypatch, dtype):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    opened, reads = _counting(monkeypatch)
    loaded = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype=dtype,
                                     max_batch_tokens=256))
    assert loaded.info.tasks == ("classify", "token_classify")
    assert list(opened.values()) == [1]  # the model and its score head share the one handle
    stored = set(load_file(tmp_path / "model.safetensors"))
    assert set(reads) == stored and max(reads.values()) == 1, reads.most_common(3)


def test_the_score_head_uses_the_workers_tokenizer(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.fakes import make_tiny_tokenizer

    config = AutoConfig.for_model("llama", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    make_tiny_tokenizer(tmp_path)
    calls = []
    real = AutoTokenizer.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        calls.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counted))
    loaded = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32",
                                     convert="classify", hf_overrides={"classifier_from_token": ["w1", "w2"]},
                                     max_batch_tokens=256))
    assert loaded.info.embedding_dim == 1 and len(calls) == 1
