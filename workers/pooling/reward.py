"""Qwen2 reward models (``Qwen2ForRewardModel``, ``Qwen2ForProcessRewardModel``): a per-token score head on Qwen2.

Both are vLLM's (``qwen2_rm.py``, after Qwen's ``modeling_qwen2_rm.py``): a Qwen2
body under ``model.`` and ``score`` = Linear(h, h) → ReLU → Linear(h, labels), both
with bias (``score.0.*``, ``score.2.*``), run in fp32 on every token; ``lm_head.*`` is
not read. They serve ``token_classify`` only:

- ``Qwen2ForRewardModel`` (Qwen2.5-Math-RM): one label, every token (ALL): ``[T, 1]``,
  sigmoid;
- ``Qwen2ForProcessRewardModel`` (Qwen2.5-Math-PRM): two labels, STEP pooling: the
  rows at tokens equal to ``step_tag_id`` (every token when unset), the columns in
  ``returned_token_ids`` (both when unset): ``[steps, 2 or k]``, softmax (sigmoid
  over one kept column).

``--pooler-config`` may change the token pooling (``tok_pooling_type``), set the STEP
tag and columns, calibrate (``logit_mean`` / ``logit_sigma``) and turn the activation
off (``use_activation``, also per request). A checkpoint whose last score layer has
another number of labels, a column past the labels, or a sequence pooling (these
models have no sequence task) is refused at load.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.pooling.classify import ClassifyHead
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.rows import all_rows, step_rows
from poolgate.workers.pooling.sources import PoolerSources

LAYERS = ("score.0", "score.2")  # Linear(h, h), then (ReLU) Linear(h, labels)
TASK = "token_classify"


@dataclass(frozen=True)
class RewardModel:
    """What one reward architecture forces: its number of labels and its token pooling."""

    labels: int
    pooling: str


REWARD_MODELS: dict[str, RewardModel] = {
    "Qwen2ForRewardModel": RewardModel(labels=1, pooling="ALL"),
    "Qwen2ForProcessRewardModel": RewardModel(labels=2, pooling="STEP"),
}


def score_head(src: PoolerSources, labels: int) -> nn.Module:
    """``score`` as an fp32 module on the device: Linear(h, h) → ReLU → Linear(h, labels)."""
    weights, name = src.weights, src.spec.architecture
    missing = [f"{layer}.{kind}" for layer in LAYERS for kind in ("weight", "bias")
               if f"{layer}.{kind}" not in weights]
    if missing:
        raise CheckpointError(weights.source, f"a {name} checkpoint needs its score head; missing {missing}")
    linears = []
    for layer in LAYERS:
        weight, bias = weights[f"{layer}.weight"].float(), weights[f"{layer}.bias"].float()  # (out, in), (out,)
        linear = nn.Linear(weight.shape[1], weight.shape[0])
        linear.load_state_dict({"weight": weight, "bias": bias})
        linears.append(linear)
    if linears[1].out_features != labels:
        raise CheckpointError(weights.source, f"{LAYERS[1]}.weight scores {linears[1].out_features} labels; "
                                              f"{name} has {labels}")
    return nn.Sequential(linears[0], nn.ReLU(), linears[1]).eval().to(src.device)


def reward_poolers(src: PoolerSources) -> DispatchPooler:
    """token_classify: the score head on the pooled tokens (ALL or STEP), then calibration and activation."""
    spec, pooler = src.spec, src.spec.pooler
    model = REWARD_MODELS[spec.architecture]
    if pooler.sequence_pooling is not None:
        raise ValueError(f"{spec.architecture} serves token_classify only; --pooler-config "
                         f"{pooler.sequence_pooling} is a sequence pooling (use tok_pooling_type ALL or STEP)")
    columns = pooler.returned_token_ids
    wrong = [c for c in columns or () if c >= model.labels]
    if wrong:
        raise ValueError(f"--pooler-config returned_token_ids {wrong} are past {spec.architecture}'s "
                         f"{model.labels} label(s)")
    width = len(columns) if columns else model.labels
    activation = nn.Sigmoid() if width < 2 else nn.Softmax(dim=-1)
    head = ClassifyHead(score_head(src, model.labels), activation, columns=columns, logit_mean=pooler.logit_mean,
                        logit_sigma=pooler.logit_sigma, use_activation=pooler.use_activation)
    method = pooler.token_pooling or model.pooling
    rows = step_rows(pooler.step_tag_id) if method == "STEP" else all_rows
    return DispatchPooler({TASK: Pooler(method, head, rows=rows)}, active=pooler.task, out_dim=width,
                          ops=src.ops)
