"""The packed BERT family against transformers' own forward on tiny random checkpoints."""
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from tests.fakes import make_tiny_checkpoint
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.models import build_model
from poolgate.workers.batch.packing import pack
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.load.weights import CheckpointError

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3], [2, 7, 7, 7, 7, 7, 7, 3]]


def _packed_hidden(folder, seqs):
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    model, arch = build_model(spec, REFERENCE, allow_pickle=False)
    assert arch.packed
    with torch.no_grad():
        return model(pack(seqs))


def _reference(model, seqs):
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])


@pytest.mark.parametrize("model_type", ["bert", "roberta", "xlm-roberta"])
def test_packed_matches_transformers(tmp_path, model_type):
    ref_model = make_tiny_checkpoint(tmp_path, model_type=model_type)
    got = _packed_hidden(tmp_path, SEQS)
    want = _reference(ref_model, SEQS)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_legacy_layernorm_names(tmp_path):
    ref_model = make_tiny_checkpoint(tmp_path, legacy_ln_names=True)
    torch.testing.assert_close(_packed_hidden(tmp_path, SEQS), _reference(ref_model, SEQS), atol=2e-5, rtol=1e-4)


def test_batched_equals_single(tiny_bert):
    folder, _ = tiny_bert
    together = _packed_hidden(folder, SEQS)
    alone = torch.cat([_packed_hidden(folder, [s]) for s in SEQS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_missing_weight_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    make_tiny_checkpoint(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop(next(k for k in state if "intermediate.dense.weight" in k))
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensors .*intermediate\.dense\.weight"):
        _packed_hidden(tmp_path, SEQS)
