"""The special-model registry: one entry per architecture, read by the model registry, the poolers and inspect."""
import pytest

from poolgate.workers.models import ARCHITECTURES, _check_heads, head_kind
from poolgate.workers.models.bert import BERT
from poolgate.workers.models.decoder_families import DECODER_ARCHITECTURES
from poolgate.workers.pooling.special import SPECIAL_MODELS


@pytest.mark.parametrize("name", sorted(SPECIAL_MODELS))
def test_each_special_model_runs_its_encoders_family(name):
    entry = SPECIAL_MODELS[name]
    assert ARCHITECTURES[name] is ARCHITECTURES[entry.encoder]
    assert entry.tasks and head_kind(name) == "model"


def test_the_registry_serves_exactly_its_entrys_tasks(tmp_path):
    from tests.workers.pooling.test_splade import SPLADE
    from tests.workers.encoder_families import save_tiny
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.load.inspect import plan

    save_tiny(tmp_path, "bert", head="model")
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="s", dtype="float32", hf_overrides=SPLADE)
    tasks = SPECIAL_MODELS["BertSpladeSparseEmbeddingModel"].tasks
    assert plan(cfg).tasks.startswith(", ".join(tasks)) and plan(cfg).pooling.startswith("SPLADE")


def test_a_name_whose_head_its_family_does_not_declare_is_refused():
    _check_heads({"BertForSequenceClassification": BERT, **DECODER_ARCHITECTURES})
    with pytest.raises(ValueError, match=r"LlamaForMaskedLM"):
        _check_heads({"LlamaForMaskedLM": DECODER_ARCHITECTURES["LlamaModel"]})
