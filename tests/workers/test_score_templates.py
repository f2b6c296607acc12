"""Score templates: chosen by the model's config, rendered as vLLM's templates, tokenized whole."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from poolgate.shared.wire import TextPair
from poolgate.workers.score_templates import (QWEN3_DEFAULT_INSTRUCTION, bge_reranker_gemma, qwen3_reranker,
                                              template_for)
from poolgate.workers.tokenizer import TextEncoder
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
    encoder = TextEncoder(tmp_path, score_template="qwen3_reranker")
    encoded = encoder.encode_pairs([TextPair("w1 w2 w3", "w4", max_text_tokens=2, instruction="w9")])
    assert encoded.ids == [ref(qwen3_reranker("w1 w2", "w4", "w9"))["input_ids"]]
    assert encoded.type_ids == [None]
