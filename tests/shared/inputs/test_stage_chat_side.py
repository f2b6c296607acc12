"""The input stage's chat rendering (the tokenizer's chat template) and left truncation, on the bundled tokenizer."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import ChatInput, ModelInfo, PoolingCall
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.inputs.tokenizer import NO_CHAT_TEMPLATE
from poolgate.workers.load.hf_tokenizer import load_encoder

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
TEXT = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(bundled_model_path())


def stage(encoder) -> InputStage:
    info = ModelInfo(served_model_name="m", architecture="BertModel", tasks=("embed",), max_model_len=64,
                     embedding_dim=384, backend="cpu", dtype="float32", vocab_size=30522)
    return InputStage(info, encoder)


def call(inputs, **params) -> PoolingCall:
    return PoolingCall(request_id="r", model="m", inputs=inputs, params=PoolingParams(**params))


@pytest.mark.parametrize("special", [True, False])
def test_left_truncation_keeps_the_last_tokens_as_transformers_does(encoder, special):
    hf = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    hf.truncation_side = "left"
    want = hf([TEXT], truncation=True, max_length=6, add_special_tokens=special)["input_ids"][0]
    got = stage(encoder).tokenize(call([TEXT, "short"], truncate_prompt_tokens=6, truncation_side="left",
                                       add_special_tokens=special))
    assert got[0] == want
    assert got[1] == hf(["short"], add_special_tokens=special)["input_ids"][0]
    right = stage(encoder).tokenize(call([TEXT], truncate_prompt_tokens=6, add_special_tokens=special))[0]
    assert right != want and len(right) == 6


def test_left_truncation_of_token_ids_keeps_the_last_ids(encoder):
    assert stage(encoder).tokenize(call([[5, 6, 7, 8]], truncate_prompt_tokens=2, truncation_side="left")) == [[7, 8]]


def test_a_chat_is_rendered_with_the_tokenizers_template(encoder, monkeypatch):
    monkeypatch.setattr(encoder, "chat_template", TEMPLATE)
    chat = ChatInput(messages=[{"role": "user", "content": "hello there"}], add_generation_prompt=True)
    hf = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    text = hf.apply_chat_template(chat.messages, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert text == "[user] hello there [assistant]"
    ids = stage(encoder).tokenize(call([chat], add_special_tokens=False))[0]
    assert ids == hf([text], add_special_tokens=False)["input_ids"][0]


def test_no_template_and_a_template_error_are_400(encoder, monkeypatch):
    chat = ChatInput(messages=[{"role": "user", "content": "x"}])
    monkeypatch.setattr(encoder, "chat_template", None)
    with pytest.raises(InvalidRequest, match="As of transformers v4.44") as info:
        stage(encoder).tokenize(call([chat]))
    assert info.value.message == NO_CHAT_TEMPLATE
    monkeypatch.setattr(encoder, "chat_template", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        stage(encoder).tokenize(call([chat]))


def test_prompts_come_from_task_instructions_else_the_sentence_transformers_config(tmp_path):
    import json

    from poolgate.workers.load.st_config import read_prompts
    assert read_prompts(tmp_path, {}) is None
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "document": "", "bad": 3}}))
    assert read_prompts(tmp_path, {}) == {"query": "query: ", "document": ""}
    assert read_prompts(tmp_path, {"task_instructions": {"search_query": "Q: "}}) == {"search_query": "Q: "}
    assert read_prompts(bundled_model_path(), {}) is None  # MiniLM defines none
