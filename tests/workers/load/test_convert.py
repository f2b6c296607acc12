"""--runner / --convert on a tiny decoder: refused as generative, converted to embed, or to a classifier."""
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.load.convert import model_kind
from tests.fakes import make_tiny_tokenizer
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 40)) + [3]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    config = AutoConfig.for_model("llama", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, pad_token_id=0, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    return folder, model


def _load(folder, **kw):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=256, **kw))


@pytest.mark.parametrize("arch, st, runner, convert, kind", [
    ("BertModel", False, "auto", "auto", "embed"),
    ("BertForSequenceClassification", False, "auto", "auto", "classify"),
    ("BertForTokenClassification", False, "auto", "auto", "token_classify"),
    ("Qwen3ForCausalLM", True, "auto", "auto", "embed"),  # a sentence-transformers folder pools
    ("Qwen3ForCausalLM", False, "pooling", "auto", "embed"),
    ("Qwen3ForCausalLM", False, "auto", "classify", "classify"),
    ("BertForSequenceClassification", False, "auto", "embed", "embed"),
    ("XLMRobertaModel", False, "auto", "none", "embed"),
    ("BertForSequenceClassification", True, "auto", "auto", "classify"),  # ST decides the runner, not the kind
    ("Qwen2ForRewardModel", False, "auto", "auto", "token_classify"),  # its own head, whatever the suffix says
    ("Qwen2ForProcessRewardModel", False, "auto", "auto", "token_classify"),
    ("GritLM", False, "auto", "auto", "embed"),
])
def test_kinds_follow_vllms_rules(arch, st, runner, convert, kind):
    assert model_kind(arch, st_config=st, runner=runner, convert=convert) == kind


def test_a_generative_checkpoint_needs_a_convert(llama):
    folder, _ = llama
    with pytest.raises(ValueError, match="--convert embed .*--convert classify"):
        _load(folder)


def test_runner_pooling_embeds_the_last_token(llama):
    folder, ref = llama
    model = _load(folder, runner="pooling")
    assert model.info.tasks == ("embed", "token_embed")
    with torch.no_grad():
        last = torch.stack([ref.model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in SEQS])
    np.testing.assert_allclose(pool_ids(model, SEQS), torch.nn.functional.normalize(last, dim=-1).numpy(),
                               atol=1e-5)


def test_convert_classify_from_tokens_is_the_yes_minus_no_score(llama):
    folder, ref = llama
    model = _load(folder, convert="classify", hf_overrides={"classifier_from_token": ["w1", "w2"]})
    assert model.info.tasks == ("classify", "token_classify") and model.info.embedding_dim == 1
    with torch.no_grad():
        logits = torch.stack([ref(input_ids=torch.tensor([s])).logits[0, -1] for s in SEQS])  # (n, vocab)
    no, yes = 6, 7  # "w1", "w2" in the tiny tokenizer's vocabulary
    want = torch.sigmoid(logits[:, yes] - logits[:, no])[:, None]
    np.testing.assert_allclose(pool_ids(model, SEQS, PoolingParams(task="classify")), want.numpy(), atol=1e-5)


def test_convert_classify_without_a_score_layer_says_what_is_missing(llama):
    folder, _ = llama
    with pytest.raises(ValueError, match="classifier_from_token"):
        _load(folder, convert="classify")


def test_convert_none_on_a_generative_checkpoint_is_refused_too():
    with pytest.raises(ValueError, match="generative"):
        model_kind("LlamaForCausalLM", st_config=False, convert="none")
