"""voyage-4-nano (``VoyageQwen3BidirectionalEmbedModel``) on the packed Qwen3, against its model class's computation
re-created in transformers: a Qwen3Model without the causal mask, ``linear`` (no bias) on every token, the mean
over tokens (vLLM's recipe: ``--pooler-config '{"pooling_type": "MEAN"}'``), L2-normalized."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from poolgate.gateway.cli import main as poolgate
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.workers.models.test_decoder_golden import SEQS, save_tiny
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import max_abs, print_figures, worst_cosine

VOYAGE = {"architectures": ["VoyageQwen3BidirectionalEmbedModel"]}
DIM = 24  # the projection's width (2048 in voyage-4-nano)


def _as_voyage(folder, **hf) -> torch.Tensor:
    """A saved Qwen3Model rewritten as voyage-4-nano ships: the body under ``model.``, ``linear.weight`` beside it,
    architectures Qwen3ForCausalLM (vLLM's recipe names the class with --hf-overrides); the projection returned."""
    state = load_file(folder / "model.safetensors")
    torch.manual_seed(1)
    linear = torch.randn(DIM, next(v for k, v in state.items() if k.endswith("embed_tokens.weight")).shape[1]) * 0.2
    save_file({**{f"model.{k}": v for k, v in state.items()}, "linear.weight": linear}, folder / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"], **hf}))
    return linear


def _load(folder, **cfg):
    return load_model(WorkerConfig(model=str(folder), served_model_name="v", dtype="float32",
                                   max_batch_tokens=1024, hf_overrides=VOYAGE, **cfg))


def _reference(ref, linear, seqs=SEQS) -> list[torch.Tensor]:
    """Each sequence's projected token states (len, DIM): the voyage model class's forward output."""
    with torch.no_grad():
        return [F.linear(ref(input_ids=torch.tensor([s])).last_hidden_state[0], linear) for s in seqs]


def _embeddings(ref, linear) -> np.ndarray:
    return torch.stack([F.normalize(t.mean(0), dim=-1) for t in _reference(ref, linear)]).numpy()


def test_embed_is_the_mean_of_the_projected_bidirectional_states(tmp_path):
    ref = save_tiny(tmp_path, "qwen3", "Qwen3Model", is_causal=False)
    linear = _as_voyage(tmp_path)
    model = _load(tmp_path)
    assert model.info.tasks == ("embed", "token_embed")
    got, want = pool_ids(model, SEQS), _embeddings(ref, linear)
    assert got.shape == (len(SEQS), DIM)
    assert worst_cosine(got, want) > 0.99999 and max_abs(got, want) < 1e-5, (worst_cosine(got, want),
                                                                             max_abs(got, want))
    causal = save_tiny(tmp_path / "causal", "qwen3", "Qwen3Model")  # same seed: same weights, causal mask
    assert max_abs(_embeddings(causal, linear), want) > 1e-3  # the mask matters: bidirectional is what agrees


def test_token_embed_is_each_projected_token_normalized(tmp_path):
    ref = save_tiny(tmp_path, "qwen3", "Qwen3Model", is_causal=False)
    linear = _as_voyage(tmp_path)
    got = pool_ids(_load(tmp_path), SEQS, PoolingParams(task="token_embed"))
    want = torch.cat([F.normalize(t, dim=-1) for t in _reference(ref, linear)]).numpy()
    assert worst_cosine(got, want) > 0.99999 and max_abs(got, want) < 1e-5


def test_pooler_config_pooling_is_honoured(tmp_path):
    ref = save_tiny(tmp_path, "qwen3", "Qwen3Model", is_causal=False)
    linear = _as_voyage(tmp_path)
    got = pool_ids(_load(tmp_path, pooler_config=PoolerConfig(pooling_type="LAST")), SEQS)
    want = torch.stack([F.normalize(t[-1], dim=-1) for t in _reference(ref, linear)]).numpy()
    assert max_abs(got, want) < 1e-5


def test_a_missing_projection_or_one_of_another_width_is_refused(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3Model", is_causal=False)
    _as_voyage(tmp_path, num_labels=DIM + 1)
    with pytest.raises(CheckpointError, match=r"linear\.weight projects to 24 dimensions.*num_labels=25"):
        _load(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("linear.weight")
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"needs its projection linear\.weight"):
        _load(tmp_path)


def test_inspect_says_packed_qwen3_bidirectional(tmp_path, capsys):
    save_tiny(tmp_path, "qwen3", "Qwen3Model", is_causal=False)
    _as_voyage(tmp_path)
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu",
                     "--hf-overrides", json.dumps(VOYAGE)]) == 0
    rows = {line[:14].strip(): line[16:] for line in capsys.readouterr().out.splitlines()}
    assert rows["architecture"] == "VoyageQwen3BidirectionalEmbedModel" and rows["implementation"] == "packed qwen3"
    assert "bidirectional" in rows["attention"] and rows["pooling"].startswith("Voyage: embed MEAN")


def figures(tmp) -> list[tuple[str, float, float]]:
    ref = save_tiny(tmp, "qwen3", "Qwen3Model", is_causal=False)
    linear = _as_voyage(tmp)
    model = _load(tmp)
    got, want = pool_ids(model, SEQS), _embeddings(ref, linear)
    tokens = pool_ids(model, SEQS, PoolingParams(task="token_embed"))
    token_want = torch.cat([F.normalize(t, dim=-1) for t in _reference(ref, linear)]).numpy()
    return [("VoyageQwen3BidirectionalEmbedModel embed", worst_cosine(got, want), max_abs(got, want)),
            ("VoyageQwen3BidirectionalEmbedModel token_embed", worst_cosine(tokens, token_want),
             max_abs(tokens, token_want))]


if __name__ == "__main__":
    print_figures(figures)
