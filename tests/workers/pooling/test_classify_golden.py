"""Classifiers and token tasks against transformers on tiny random checkpoints (fp32)."""
import numpy as np
import pytest
import torch
from transformers import (AutoConfig, AutoModel, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification)

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import make_tiny_tokenizer, save_random
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 40)) + [3], [2, 3]]
ENCODER = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _save(folder, model_type: str, auto, **extra):
    pad = {"pad_token_id": 0} if model_type == "bert" else {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    positions = 64 + (2 if model_type in ("roberta", "xlm-roberta") else 0)
    kw = ENCODER if model_type != "distilbert" else dict(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                                          hidden_dim=64)
    config = AutoConfig.for_model(model_type, max_position_embeddings=positions, **pad, **kw, **extra)
    return save_random(folder, auto, config)


def _load(folder):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=256))


def _logits(ref, seqs) -> list[torch.Tensor]:
    with torch.no_grad():
        return [ref(input_ids=torch.tensor([s])).logits[0] for s in seqs]


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_sequence_classifier_with_three_labels(tmp_path, model_type):
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    ref = _save(tmp_path, model_type, AutoModelForSequenceClassification, num_labels=3, id2label=labels,
                label2id={v: k for k, v in labels.items()})
    model = _load(tmp_path)
    assert model.info.tasks == ("classify", "token_classify")
    assert model.info.labels == ("negative", "neutral", "positive") and model.info.embedding_dim == 3
    logits = torch.stack(_logits(ref, SEQS))  # (n, 3)
    probs = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(probs, torch.softmax(logits, -1).numpy(), atol=1e-5)
    raw = pool_ids(model, SEQS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(raw, logits.numpy(), atol=1e-4)


def test_one_label_is_a_sigmoid_score(tmp_path):
    ref = _save(tmp_path, "bert", AutoModelForSequenceClassification, num_labels=1)
    model = _load(tmp_path)
    scores = pool_ids(model, SEQS, PoolingParams(task="classify"))
    assert scores.shape == (4, 1)
    np.testing.assert_allclose(scores, torch.sigmoid(torch.stack(_logits(ref, SEQS))).numpy(), atol=1e-5)


def test_multi_label_problem_type_uses_sigmoid(tmp_path):
    ref = _save(tmp_path, "bert", AutoModelForSequenceClassification, num_labels=3,
                problem_type="multi_label_classification")
    got = pool_ids(_load(tmp_path), SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, torch.sigmoid(torch.stack(_logits(ref, SEQS))).numpy(), atol=1e-5)


def test_token_classifier(tmp_path):
    ref = _save(tmp_path, "bert", AutoModelForTokenClassification, num_labels=5)
    model = _load(tmp_path)
    assert model.info.tasks == ("token_classify",)
    outputs = model.runner.execute(model.runner.prepare(
        [Sequence(s, PoolingParams(task="token_classify")) for s in SEQS]))
    (run,) = outputs
    assert run.rows.offsets.tolist() == np.cumsum([0, *map(len, SEQS)]).tolist()
    for i, logits in enumerate(_logits(ref, SEQS)):
        np.testing.assert_allclose(run.rows.item(i), torch.softmax(logits, -1).numpy(), atol=1e-5)


# packed DistilBERT; ELECTRA (GELU between its head's linears) and DeBERTa-v2 (its pooler_hidden_act) fall back
@pytest.mark.parametrize("model_type", ["distilbert", "electra", "deberta-v2"])
def test_two_label_classifier(tmp_path, model_type):
    extra = {"pooler_hidden_act": "relu"} if model_type == "deberta-v2" else {}
    ref = _save(tmp_path, model_type, AutoModelForSequenceClassification, num_labels=2, **extra)
    model = _load(tmp_path)
    assert model.padded == (model_type != "distilbert")  # the transformers fallback runs padded batches
    got = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, torch.softmax(torch.stack(_logits(ref, SEQS)), -1).numpy(), atol=1e-5)


def test_token_embed_and_embed_share_a_batch(tmp_path):
    ref = _save(tmp_path, "bert", AutoModel)
    model = _load(tmp_path)
    assert model.info.tasks == ("embed", "token_embed")
    seqs = [Sequence(SEQS[0], PoolingParams(task="token_embed")), Sequence(SEQS[1], PoolingParams()),
            Sequence(SEQS[2], PoolingParams(task="token_embed"))]
    outputs = model.runner.execute(model.runner.prepare(seqs))
    assert [(o.start, o.stop) for o in outputs] == [(0, 1), (1, 2), (2, 3)]
    with torch.no_grad():
        hidden = [ref(input_ids=torch.tensor([s])).last_hidden_state[0] for s in SEQS[:3]]
    norm = torch.nn.functional.normalize
    np.testing.assert_allclose(outputs[0].rows.item(0), norm(hidden[0], dim=-1).numpy(), atol=1e-5)
    np.testing.assert_allclose(outputs[2].rows.item(0), norm(hidden[2], dim=-1).numpy(), atol=1e-5)
    np.testing.assert_allclose(outputs[1].rows.item(0), norm(hidden[1][0], dim=-1).numpy(), atol=1e-5)  # CLS


def test_the_dispatch_pooler_is_checked_when_built():
    head = EmbedHead(None, True)
    with pytest.raises(ValueError, match="cannot pool with ALL"):
        DispatchPooler({"embed": Pooler("ALL", head)})
    with pytest.raises(ValueError, match="cannot pool with CLS"):
        DispatchPooler({"token_embed": Pooler("CLS", head)})
    with pytest.raises(ValueError, match="unknown task"):
        DispatchPooler({"score": Pooler("CLS", head)})
    with pytest.raises(ValueError, match="unknown pooling type"):
        DispatchPooler({"embed": Pooler("MAX", head)})
    assert DispatchPooler({"token_embed": Pooler("ALL", head), "embed": Pooler("CLS", head)}).tasks == (
        "embed", "token_embed")


def test_decoder_classifier_pools_the_last_token(tmp_path):
    config = AutoConfig.for_model("llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  hidden_size=32, intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                                  num_labels=3, pad_token_id=0, architectures=["LlamaForSequenceClassification"])
    torch.manual_seed(0)
    ref = AutoModelForSequenceClassification.from_config(config).eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    got = pool_ids(_load(tmp_path), SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, torch.softmax(torch.stack(_logits(ref, SEQS)), -1).numpy(), atol=1e-5)


def _load_with(folder, **cfg):
    from poolgate.shared.config.pooler_config import PoolerConfig

    hf_overrides = cfg.pop("hf_overrides", {})
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=256, pooler_config=PoolerConfig(**cfg), hf_overrides=hf_overrides))


def test_pooler_config_task_calibration_and_activation_default(tmp_path):
    ref = _save(tmp_path, "bert", AutoModelForSequenceClassification, num_labels=3)
    logits = torch.stack(_logits(ref, SEQS))
    model = _load_with(tmp_path, task="token_classify", logit_mean=0.25, logit_sigma=2.0, use_activation=False)
    assert model.info.tasks == ("token_classify", "classify")  # the configured task is the active one
    got = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, ((logits - 0.25) / 2.0).numpy(), atol=1e-4)  # calibrated, no activation
    on = pool_ids(model, SEQS, PoolingParams(task="classify", use_activation=True))
    np.testing.assert_allclose(on, torch.softmax((logits - 0.25) / 2.0, -1).numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="Unsupported task: 'embed'"):
        _load_with(tmp_path, task="embed")


def test_default_dimensions_and_hf_overrides(tmp_path):
    ref = _save(tmp_path, "bert", AutoModel)
    model = _load_with(tmp_path, seq_pooling_type="MEAN", dimensions=8,
                       hf_overrides={"matryoshka_dimensions": [8, 16]})
    assert model.info.is_matryoshka and model.info.matryoshka_dimensions == (8, 16)
    assert model.info.embedding_dim == 8
    got = pool_ids(model, SEQS[:2])
    with torch.no_grad():
        means = torch.stack([ref(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0) for s in SEQS[:2]])
    want = torch.nn.functional.normalize(means[:, :8], dim=-1)  # slice, then normalize
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)

    with pytest.raises(ValueError, match="needs a Matryoshka model"):
        _load_with(tmp_path, dimensions=8)


def test_step_pooling_keeps_the_tag_positions_and_the_returned_columns(tmp_path):
    ref = _save(tmp_path, "bert", AutoModelForTokenClassification, num_labels=5)
    model = _load_with(tmp_path, tok_pooling_type="STEP", step_tag_id=11, returned_token_ids=(1, 3))
    seqs = [[2, 10, 11, 12, 11, 3], [2, 40, 3], [2, 11, 3]]
    (run,) = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task="token_classify"))
                                                         for s in seqs]))
    assert run.rows.offsets.tolist() == [0, 2, 2, 3]  # two tags, none, one
    for i, (s, logits) in enumerate(zip(seqs, _logits(ref, seqs))):
        at = [j for j, t in enumerate(s) if t == 11]
        np.testing.assert_allclose(run.rows.item(i), torch.softmax(logits[at][:, [1, 3]], -1).numpy(), atol=1e-5)


def test_step_pooling_on_a_generative_reward_model_reads_its_lm_head(tmp_path):
    from transformers import AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                  pad_token_id=0, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(config).eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    from poolgate.shared.config.pooler_config import PoolerConfig

    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="prm", dtype="float32",
                                    convert="classify", pooler_config=PoolerConfig(
                                        task="token_classify", tok_pooling_type="STEP", step_tag_id=11,
                                        returned_token_ids=(6, 7))))
    seqs = [[2, 10, 11, 12, 11, 3], [2, 11, 3]]
    (run,) = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task="token_classify"))
                                                         for s in seqs]))
    for i, s in enumerate(seqs):
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([s])).logits[0]  # (T, vocab)
        at = [j for j, t in enumerate(s) if t == 11]
        # the returned columns are kept first, then the activation (softmax over those columns)
        np.testing.assert_allclose(run.rows.item(i), torch.softmax(logits[at][:, [6, 7]], -1).numpy(), atol=1e-5)


def test_token_classify_uses_the_classifier_alone_even_with_bert_pooler_weights(tmp_path):
    """BERT's pooler pools [CLS] for classify; per token only the classifier applies. NER checkpoints that
    still carry the unused pooler weights must get the same per-token answer."""
    seq = _save(tmp_path / "seq", "bert", AutoModelForSequenceClassification, num_labels=3)
    rows = _load(tmp_path / "seq").runner
    (run,) = rows.execute(rows.prepare([Sequence(s, PoolingParams(task="token_classify")) for s in SEQS]))
    with torch.no_grad():
        hidden = [seq.bert(input_ids=torch.tensor([s])).last_hidden_state[0] for s in SEQS]
        want = [torch.softmax(seq.classifier(h), -1) for h in hidden]
    for i, w in enumerate(want):
        np.testing.assert_allclose(run.rows.item(i), w.numpy(), atol=1e-5)
    ner = _save(tmp_path / "ner", "bert", AutoModelForTokenClassification, num_labels=5)
    from safetensors.torch import load_file, save_file

    path = tmp_path / "ner" / "model.safetensors"
    state = load_file(str(path))
    state["bert.pooler.dense.weight"] = torch.randn(32, 32)
    state["bert.pooler.dense.bias"] = torch.randn(32)
    save_file(state, str(path), metadata={"format": "pt"})
    got = pool_ids(_load(tmp_path / "ner"), SEQS[:1], PoolingParams(task="token_classify"))
    np.testing.assert_allclose(got, torch.softmax(_logits(ner, SEQS[:1])[0], -1).numpy(), atol=1e-5)


def test_default_dimensions_are_refused_for_a_classifier(tmp_path):
    _save(tmp_path, "bert", AutoModelForSequenceClassification, num_labels=3)
    with pytest.raises(ValueError, match="applies to dense embeddings"):
        _load_with(tmp_path, dimensions=2)


def test_a_head_whose_activation_is_not_known_is_refused(tmp_path):
    # Nystromformer names its head as RoBERTa does (classifier.dense, classifier.out_proj) but uses its hidden_act
    _save(tmp_path, "nystromformer", AutoModelForSequenceClassification, num_labels=2)
    with pytest.raises(Exception, match="model_type 'nystromformer' is not one poolgate has verified"):
        _load(tmp_path)
