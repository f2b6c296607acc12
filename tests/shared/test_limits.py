"""shared.domain.limits: vLLM's messages for params, lengths and token ids."""
import json

import pytest

from poolgate.shared.domain.errors import ContextLengthExceeded, InvalidRequest
from poolgate.shared.domain.limits import (
    cap_task, check_call, check_inputs, check_length, check_params, check_task, check_token_ids, input_cap, truncation_length,
)
from poolgate.shared.wire.messages import PoolingCall
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import ModelInfo, WindowedText

INFO = ModelInfo(served_model_name="m", architecture="BertModel", tasks=("embed",), max_model_len=16,
                 embedding_dim=8, backend="cpu", dtype="float32", vocab_size=100)
MRL = ModelInfo(**{**INFO.to_wire(), "is_matryoshka": True, "matryoshka_dimensions": (4, 8)})


def test_truncation_lengths():
    assert truncation_length(INFO, PoolingParams()) is None
    assert truncation_length(INFO, PoolingParams(truncate_prompt_tokens=-1)) == 16
    assert truncation_length(INFO, PoolingParams(truncate_prompt_tokens=5)) == 5
    with pytest.raises(InvalidRequest, match="greater than max_model_len"):
        check_params(INFO, PoolingParams(truncate_prompt_tokens=17))


CHUNKED = ModelInfo(**{**INFO.to_wire(), "tasks": ("embed", "token_embed"), "chunked_processing": True})
CAPPED = ModelInfo(**{**CHUNKED.to_wire(), "max_embed_len": 40})


def test_chunked_processing_moves_the_embed_input_cap():
    assert ModelInfo.from_wire(CAPPED.to_wire()) == CAPPED
    assert [input_cap(i, "embed") for i in (INFO, CHUNKED, CAPPED)] == [16, None, 40]
    assert input_cap(CAPPED, "token_embed") == 16  # only embed inputs are chunked
    assert truncation_length(CHUNKED, PoolingParams(truncate_prompt_tokens=-1)) is None  # no cap: keep all
    assert truncation_length(CAPPED, PoolingParams(truncate_prompt_tokens=-1)) == 40
    check_params(CHUNKED, PoolingParams(truncate_prompt_tokens=1000))
    check_params(CAPPED, PoolingParams(truncate_prompt_tokens=40))
    with pytest.raises(InvalidRequest, match="greater than max_embed_len"):
        check_params(CAPPED, PoolingParams(truncate_prompt_tokens=41))
    with pytest.raises(InvalidRequest, match="greater than max_model_len"):
        check_params(CAPPED, PoolingParams(task="token_embed", truncate_prompt_tokens=17))
    check_length(CHUNKED, 10_000, "embed")
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 40 tokens. However, your prompt "
                                                    "contains 41 input tokens"):
        check_length(CAPPED, 41, "embed")
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 16 tokens"):
        check_length(CHUNKED, 17, "token_embed")


def test_dimensions_rules():
    with pytest.raises(InvalidRequest, match="does not support Matryoshka embeddings; dimensions must be unset"):
        check_params(INFO, PoolingParams(dimensions=4))
    check_params(MRL, PoolingParams(dimensions=4))
    with pytest.raises(InvalidRequest, match=r"only supports Matryoshka dimensions \[4, 8\], got 5"):
        check_params(MRL, PoolingParams(dimensions=5))


def test_task_lengths_and_token_ids():
    with pytest.raises(InvalidRequest, match="Unsupported task"):
        check_task(INFO, PoolingParams(task="classify"))
    with pytest.raises(InvalidRequest, match="Unsupported task"):
        check_call(INFO, PoolingCall(request_id="r", model="m", inputs=["x"], params=PoolingParams(task="classify")))
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 16 tokens"):
        check_length(INFO, 17)
    with pytest.raises(InvalidRequest, match="cannot be empty"):
        check_length(INFO, 0)
    check_token_ids(INFO, [0, 99])
    with pytest.raises(InvalidRequest, match="Token id 100 is out of vocabulary"):
        check_token_ids(INFO, [1, 100])


@pytest.mark.parametrize("inputs, message", [
    ([], "You must pass at least one prompt"),
    ([[1.5]], "each input must be a string or a list"),
    ([["a"]], "each input must be a string or a list"),
    ([[-1]], "each input must be a string or a list"),
    ([[True]], "each input must be a string or a list"),
    ([None], "each input must be a string or a list"),
    (["ok", "a\ud800b"], "not valid Unicode"),
    ([[1, 100]], "Token id 100 is out of vocabulary"),
])
def test_inputs_are_texts_or_in_vocabulary_ids(inputs, message):
    with pytest.raises(InvalidRequest, match=message) as err:
        check_inputs(INFO, inputs)
    assert err.value.param == "input"
    check_inputs(INFO, ["fine", [0, 99], []])  # an empty id list is refused later, by its length


def test_a_multi_output_calls_outputs_are_checked_and_read_whole_inputs():
    dense, tokens = PoolingParams(), PoolingParams(task="token_embed")
    multi = PoolingParams(outputs=(tokens,))
    assert PoolingParams.from_wire(json.loads(json.dumps(multi.to_wire()))) == multi
    check_params(CHUNKED, multi)
    assert multi.all_outputs() == (multi, tokens) and dense.all_outputs() == (dense,)
    assert input_cap(CAPPED, cap_task(multi)) == 16 and input_cap(CAPPED, cap_task(dense)) == 40  # no chunking
    assert truncation_length(CAPPED, PoolingParams(truncate_prompt_tokens=-1, outputs=(
        PoolingParams(task="token_embed", truncate_prompt_tokens=-1),))) == 16
    for outputs, message in [
        ((PoolingParams(task="classify"),), "Unsupported task"),
        ((PoolingParams(task="token_embed", truncate_prompt_tokens=4),), "truncate_prompt_tokens differs"),
        ((PoolingParams(task="token_embed", outputs=(dense,)),), "outputs of its own"),
        ((PoolingParams(task="token_embed", dimensions=4),), "does not support Matryoshka"),
    ]:
        with pytest.raises(InvalidRequest, match=message):
            check_params(CHUNKED, PoolingParams(outputs=outputs))
    with pytest.raises(InvalidRequest, match="one output per call"):
        check_call(CHUNKED, PoolingCall("r", "m", [WindowedText("a b c", max_windows=2)], multi))
