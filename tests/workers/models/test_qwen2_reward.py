"""Qwen2ForRewardModel and Qwen2ForProcessRewardModel served by the packed Qwen2, against a reference written from
their published layout (transformers has no class for them): transformers' Qwen2Model on the ``model.*`` tensors,
then ``score`` = Linear(h, h) → ReLU → Linear(h, labels) on every token, in torch here; sigmoid for the one-label
reward model, softmax for the process reward model, whose STEP rows are the ``step_tag_id`` tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.load.build import load_model
from poolgate.workers.load.inspect import plan
from poolgate.workers.load.weights import CheckpointError
from tests.fakes import make_tiny_tokenizer
from tests.workers.models.test_decoder_golden import SEQS, SHAPE
from tests.workers.pooled import pool_ids

RM, PRM = "Qwen2ForRewardModel", "Qwen2ForProcessRewardModel"
STEP_TAG = 9  # once in SEQS[2], four times in SEQS[4]
TOKEN = PoolingParams(task="token_classify")


def save_reward(folder, architecture: str, labels: int, *, seed: int = 0, tokenizer=make_tiny_tokenizer, **extra):
    """A tiny random Qwen2 reward checkpoint as Qwen ships one (``model.*``, ``score.{0,2}.*``, ``lm_head``) and
    ``tokenizer(folder)``'s tokenizer; returns (transformers' Qwen2Model of it, the score head in torch)."""
    config = AutoConfig.for_model("qwen2", architectures=[architecture], num_labels=labels, **{**SHAPE, **extra})
    torch.manual_seed(seed)
    body = AutoModel.from_config(config, attn_implementation="eager").eval()
    h = config.hidden_size
    score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, labels)).eval()
    with torch.no_grad():
        for p in [*body.parameters(), *score.parameters()]:
            p.normal_(0.0, 0.1)
    state = {f"model.{k}": v for k, v in body.state_dict().items()}
    state |= {f"score.{k}": v for k, v in score.state_dict().items()}
    state["lm_head.weight"] = torch.randn(config.vocab_size, h)  # not read (vLLM ignores it too)
    tensors = {k: v.contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    tokenizer(folder)
    return body, score


def reference_logits(body, score, seqs) -> list[torch.Tensor]:
    """Per sequence, (T, labels) logits: Qwen2Model, then the score head on every token, in fp32."""
    with torch.no_grad():
        return [score(body(input_ids=torch.tensor([s])).last_hidden_state[0]) for s in seqs]


def _load(folder, **pooler):
    return load_model(WorkerConfig(model=str(folder), served_model_name="rm", dtype="float32",
                                   max_batch_tokens=1024, pooler_config=PoolerConfig.from_dict(pooler)))


def _close(got: np.ndarray, want: torch.Tensor) -> None:
    diff = np.abs(got - want.numpy()).max()
    assert got.shape == tuple(want.shape) and diff <= 1e-5, (got.shape, tuple(want.shape), diff)


def test_the_reward_model_scores_every_token_with_sigmoid(tmp_path):
    body, score = save_reward(tmp_path, RM, 1)
    model = _load(tmp_path)
    assert model.info.tasks == ("token_classify",) and model.info.embedding_dim == 1
    assert model.runner.model.__class__.__name__ == "PackedDecoder"
    logits = torch.cat(reference_logits(body, score, SEQS))  # (all tokens, 1)
    _close(pool_ids(model, SEQS, TOKEN), torch.sigmoid(logits))
    _close(pool_ids(model, SEQS, PoolingParams(task="token_classify", use_activation=False)), logits)


def test_the_process_reward_model_keeps_the_step_rows_with_softmax(tmp_path):
    body, score = save_reward(tmp_path, PRM, 2)
    logits = reference_logits(body, score, SEQS)
    model = _load(tmp_path, pooling_type="STEP", step_tag_id=STEP_TAG)
    steps = torch.cat([lg[torch.tensor(s) == STEP_TAG] for lg, s in zip(logits, SEQS, strict=True)])  # (5, 2)
    assert steps.shape == (5, 2)
    _close(pool_ids(model, SEQS, TOKEN), torch.softmax(steps, dim=-1))
    untagged = _load(tmp_path)  # STEP by default; no tag: every token
    _close(pool_ids(untagged, SEQS, TOKEN), torch.softmax(torch.cat(logits), dim=-1))


def test_returned_token_ids_pick_the_columns_before_the_activation(tmp_path):
    body, score = save_reward(tmp_path, PRM, 2)
    logits = torch.cat(reference_logits(body, score, SEQS))
    swapped = _load(tmp_path, pooling_type="STEP", returned_token_ids=[1, 0])
    _close(pool_ids(swapped, SEQS, TOKEN), torch.softmax(logits[:, [1, 0]], dim=-1))
    one = _load(tmp_path, pooling_type="STEP", returned_token_ids=[1])
    assert one.info.embedding_dim == 1
    _close(pool_ids(one, SEQS, TOKEN), torch.sigmoid(logits[:, [1]]))


@pytest.mark.parametrize("architecture, labels, pooler, error, match", [
    (RM, 2, {}, CheckpointError, r"score.2.weight scores 2 labels; Qwen2ForRewardModel has 1"),
    (PRM, 2, {"pooling_type": "STEP", "returned_token_ids": [2]}, ValueError, r"returned_token_ids \[2\] are past"),
    (PRM, 2, {"pooling_type": "LAST"}, ValueError, r"serves token_classify only"),
])
def test_what_it_cannot_honour_is_refused(tmp_path, architecture, labels, pooler, error, match):
    save_reward(tmp_path, architecture, labels)
    with pytest.raises(error, match=match):
        _load(tmp_path, **pooler)


@pytest.mark.parametrize("architecture, labels", [(RM, 1), (PRM, 2)])
def test_inspect_says_how_it_runs(tmp_path, architecture, labels):
    save_reward(tmp_path, architecture, labels)
    p = plan(WorkerConfig(model=str(tmp_path), served_model_name="rm"), CpuBackend())
    assert p.implementation == "packed qwen2" and p.tasks == "token_classify (served as token_classify)"
    assert p.attention.endswith("; causal") and f"to {labels} label" in p.pooling


def test_dtype_auto_probes_what_the_active_task_keeps(tmp_path):
    """One-label scores are compared as one vector; STEP rows at a tag the probes lack leave float32 in place."""
    save_reward(tmp_path, PRM, 2)
    cfg = {"model": str(tmp_path), "served_model_name": "rm", "max_batch_tokens": 1024}
    tagged = load_model(WorkerConfig(**cfg, pooler_config=PoolerConfig.from_dict(
        {"pooling_type": "STEP", "step_tag_id": STEP_TAG})))
    assert tagged.info.dtype == "float32"
    rm = tmp_path / "rm"
    rm.mkdir()
    save_reward(rm, RM, 1)
    model = load_model(WorkerConfig(**{**cfg, "model": str(rm)}))
    assert pool_ids(model, SEQS, TOKEN).shape == (sum(map(len, SEQS)), 1)


def test_its_auto_map_is_never_asked_about_on_stdin(tmp_path, monkeypatch):
    """Qwen's reward checkpoints name their own code (``auto_map``); the packed Qwen2 needs none of it."""
    import builtins
    import json

    save_reward(tmp_path, RM, 1)
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                          "AutoModel": "modeling_qwen2_rm.Qwen2ForRewardModel"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(builtins, "input", lambda *a, **k: pytest.fail("transformers asked about remote code"))
    assert _load(tmp_path).info.tasks == ("token_classify",)
