"""Packed BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT and MPNet agree with transformers (fp32, cosine ≥ 0.9999).

The cases (tiny random checkpoints made here, one batch of mixed lengths,
hidden states and served outputs) are in ``tests.workers.encoder_families``,
which also prints the figures.
"""
import pytest
import torch

from tests.workers.encoder_families import (
    FAMILIES, SEQS, agreement, cases, packed_hidden, reference_hidden, save_tiny)

MIN_COSINE = 0.9999


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_agrees_with_transformers(tmp_path, model_type):
    for what, got, want in cases(tmp_path, model_type):
        assert got.shape == want.shape, what
        cos, diff = agreement(got, want)
        assert cos >= MIN_COSINE and diff < 1e-3, f"{model_type} {what}: cosine {cos}, max diff {diff}"


@pytest.mark.parametrize("model_type", FAMILIES)
def test_batched_equals_single(tmp_path, model_type):
    save_tiny(tmp_path, model_type, seed=1)
    together = packed_hidden(tmp_path)
    alone = torch.cat([packed_hidden(tmp_path, [s]) for s in SEQS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_bert_token_type_ids_are_embedded(tmp_path):
    ref = save_tiny(tmp_path, "bert")
    seqs = [[2, 10, 11, 3, 20, 21, 3], [2, 40, 3], [2, 5, 3, 6, 6, 3]]
    types = [[0, 0, 0, 0, 1, 1, 1], None, [0, 0, 0, 1, 1, 1]]
    got = packed_hidden(tmp_path, seqs, types)
    want = reference_hidden(ref, seqs, [t or [0] * len(s) for s, t in zip(seqs, types)])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got, packed_hidden(tmp_path, seqs), atol=1e-3)  # the types change the result


def test_every_registered_family_follows_the_protocol():
    from poolgate.workers.models import ARCHITECTURES
    from poolgate.workers.models.base import HEAD_KINDS
    from poolgate.workers.models.hf_auto import HfAutoEncoder

    import typing

    for name, family in ARCHITECTURES.items():  # the model class, or what a factory says it returns
        cls = family.model if isinstance(family.model, type) else typing.get_type_hints(family.model)["return"]
        for method in ("load_weights", "forward"):
            assert callable(getattr(cls, method, None)), f"{name}: {family.name} lacks {method}"
        assert not hasattr(cls, "use_packed_linears"), f"{name}: kernel choices belong to the backend's ops"
        assert family.heads <= HEAD_KINDS and family.default_pooling in ("CLS", "MEAN", "LAST")
    assert HfAutoEncoder.needs_groups is False  # the fallback runs transformers' attention: no group plan


def test_model_code_makes_no_backend_choice():
    """Families build from the injected ops bundle: no kernel, backend or device choice in workers/models."""
    from pathlib import Path

    import poolgate.workers.models as models

    banned = ("grouped_sdpa", "varlen_flash", "PackedLinear", "mkldnn", "kernels.linear", "kernels.norm",
              "kernels.rope", "ensure_groups", ".cuda", "nn.Linear(", "nn.LayerNorm(")
    allowed = {"hf_auto.py", "score.py"}  # transformers' own model; classifier heads (run by the poolers in fp32)
    for path in sorted(Path(models.__file__).parent.glob("*.py")):
        if path.name in allowed:
            continue
        text = path.read_text()
        found = [word for word in banned if word in text]
        if path.name == "modernbert.py":  # its classifier head (ModernBertHead) is a pooler's, not the encoder's
            found = [w for w in found if w not in ("nn.Linear(", "nn.LayerNorm(")]
        assert not found, f"workers/models/{path.name} names {found}"


@pytest.mark.parametrize("model_type,grouped", [("mpnet", True), ("bert", False)])
def test_runner_plans_groups_for_models_that_need_them(tmp_path, monkeypatch, model_type, grouped):
    """On a backend without the group plan (CUDA's varlen path), MPNet's bias still gets its groups at prepare."""
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.shared.domain.params import PoolingParams
    from poolgate.workers.backends.cpu import CpuBackend
    from poolgate.workers.load.build import load_model
    from poolgate.workers.engine.sequence import Sequence

    from poolgate.workers.kernels.attention import reference_attention

    monkeypatch.setattr(CpuBackend, "attention", lambda self, dtype: reference_attention)  # reads no group plan
    save_tiny(tmp_path, model_type)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32",
                                    backend="cpu", max_batch_tokens=256, num_threads=1))  # one lane: one batch
    prepared = model.runner.prepare([Sequence(s, PoolingParams()) for s in SEQS])
    assert (prepared.packed.groups is not None) == grouped
