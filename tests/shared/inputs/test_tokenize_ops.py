"""The input stage's /tokenize and /detokenize helpers on a real fast tokenizer, against transformers'."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.stage import InputStage
from poolgate.workers.load.hf_tokenizer import load_encoder
from tests.fakes import fake_model, make_tiny_tokenizer


def test_tokenize_detokenize_and_token_strings_match_transformers(tmp_path):
    make_tiny_tokenizer(tmp_path)
    ref = AutoTokenizer.from_pretrained(str(tmp_path))
    encoder = load_encoder(tmp_path)
    stage = InputStage(fake_model(max_model_len=4).info, encoder)
    text = "w1 w2 w3 w4 w5 w6"  # longer than the model: counted, not refused
    ids = stage.tokenize_one(text)
    assert ids == ref(text)["input_ids"]
    assert stage.tokenize_one(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"]
    assert encoder.token_strs(ids) == ref.convert_ids_to_tokens(ids)
    assert stage.detokenize(ids) == ref.decode(ids)
    with pytest.raises(InvalidRequest, match="out of vocabulary"):
        stage.detokenize([1, 10**6])
