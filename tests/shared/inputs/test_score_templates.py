"""Score templates: chosen by the model's config, rendered as vLLM's templates, tokenized whole."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from poolgate.shared.wire.messages import TextPair
from poolgate.shared.inputs.score_templates import (QWEN3_DEFAULT_INSTRUCTION, bge_reranker_gemma, qwen3_reranker,
                                              template_for)
from poolgate.workers.load.hf_tokenizer import load_encoder
from tests.fakes import make_tiny_tokenizer


def test_the_config_picks_the_template():
    assert template_for({}) is None
    assert template_for({"is_original_qwen3_reranker": True}) == "qwen3_reranker"
    assert template_for({"score_template": "bge_reranker_gemma"}) == "bge_reranker_gemma"
    with pytest.raises(ValueError, match="unknown score_template 'nope'"):
        template_for({"score_template": "nope"})


def test_qwen3_reranker_prompt_is_vllms_template():
    prompt = qwen3_reranker("what is x", "x is y", None)
    assert prompt == (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
        f"<Instruct>: {QWEN3_DEFAULT_INSTRUCTION}\n<Query>: what is x\n<Document>: x is y<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<Instruct>: find code\n" in qwen3_reranker("q", "d", "find code")
    assert bge_reranker_gemma("q", "d", None).startswith("A: q\nB: d\nGiven a query A and a passage B")


def test_a_templated_pair_is_the_prompt_tokenized_whole(tmp_path):
    make_tiny_tokenizer(tmp_path, pair_types=True)
    ref = AutoTokenizer.from_pretrained(str(tmp_path))
    encoder = load_encoder(tmp_path, score_template="qwen3_reranker")
    encoded = encoder.encode_pairs([TextPair("w1 w2 w3", "w4", max_text_tokens=2, instruction="w9")])
    assert encoded.ids == [ref(qwen3_reranker("w1 w2", "w4", "w9"))["input_ids"]]
    assert encoded.type_ids == [None]


def test_truncation_cuts_the_document_never_the_template(tmp_path):
    make_tiny_tokenizer(tmp_path, pair_types=True)
    ref = AutoTokenizer.from_pretrained(str(tmp_path))
    encoder = load_encoder(tmp_path, score_template="qwen3_reranker")
    whole = ref(qwen3_reranker("w1", "w4 w5 w6 w7", None))["input_ids"]
    (ids,) = encoder.encode_pairs([TextPair("w1", "w4 w5 w6 w7")], max_tokens=len(whole) - 2).ids
    assert ids == ref(qwen3_reranker("w1", "w4 w5", None))["input_ids"]  # the prompt's tail (read for the score) kept
    template_only = len(ref(qwen3_reranker("w1", "", None))["input_ids"])
    with pytest.raises(Exception, match="cannot hold this reranker's prompt"):
        encoder.encode_pairs([TextPair("w1", "w4 w5 w6 w7")], max_tokens=template_only)


def test_a_pair_truncation_below_the_special_tokens_is_refused(tmp_path):
    make_tiny_tokenizer(tmp_path, pair_types=True)
    encoder = load_encoder(tmp_path)
    with pytest.raises(Exception, match="cannot hold a pair"):
        encoder.encode_pairs([TextPair("w1 w2 w3", "w4 w5 w6")], max_tokens=2)
    (ids,) = encoder.encode_pairs([TextPair("w1 w2 w3", "w4 w5 w6")], max_tokens=5).ids
    assert len(ids) == 5


def test_a_qwen3_style_reranker_scores_p_yes_of_its_prompt(tmp_path):
    """Qwen3-Reranker as vLLM serves it (sequence-classification architecture, classifier_from_token [no, yes],
    is_original_qwen3_reranker) on a tiny random Qwen3: sigmoid(logit_yes - logit_no) at the prompt's last
    token, as transformers' causal LM computes it on the same prompt."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from poolgate.workers.offline import PoolingModel

    config = AutoConfig.for_model("qwen3", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=256,
                                  pad_token_id=0, bos_token_id=2, eos_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(config).eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    no, yes = tokenizer.convert_tokens_to_ids(["w10", "w11"])  # the tiny vocabulary's "no" and "yes"
    pairs = [("w1 w2", "w3 w4 w5"), ("w1 w2", "w6"), ("w7", "w8 w9")]
    with torch.no_grad():
        logits = [ref(**tokenizer(qwen3_reranker(q, d, "w12"), return_tensors="pt")).logits[0, -1] for q, d in pairs]
    want = [torch.sigmoid(x[yes] - x[no]).item() for x in logits]
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["w10", "w11"],
                 "is_original_qwen3_reranker": True}
    with PoolingModel(str(tmp_path), dtype="float32", hf_overrides=overrides) as model:
        got = model.score([q for q, _ in pairs], [d for _, d in pairs], instruction="w12")
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_cap_on_a_lower_casing_tokenizer_cuts_where_its_tokens_end():
    from poolgate.shared.config.models import bundled_model_path

    encoder = load_encoder(bundled_model_path(), do_lower_case=True)  # MiniLM lower-cases; "İ" grows when it does
    cut = encoder.cut("İİİİ hello world again", 3)
    assert encoder.backend.encode(cut.lower(), add_special_tokens=False).tokens == ["iii", "##i", "hello"]
