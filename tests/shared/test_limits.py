"""shared.limits: vLLM's messages for params, lengths and token ids."""
import pytest

from poolgate.shared.errors import ContextLengthExceeded, InvalidRequest
from poolgate.shared.limits import check_call, check_inputs, check_length, check_params, check_task, check_token_ids, truncation_length
from poolgate.shared.wire import PoolingCall
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import ModelInfo

INFO = ModelInfo(served_model_name="m", architecture="BertModel", tasks=("embed",), max_model_len=16,
                 embedding_dim=8, backend="cpu", dtype="float32", vocab_size=100)
MRL = ModelInfo(**{**INFO.to_wire(), "is_matryoshka": True, "matryoshka_dimensions": (4, 8)})


def test_truncation_lengths():
    assert truncation_length(INFO, PoolingParams()) is None
    assert truncation_length(INFO, PoolingParams(truncate_prompt_tokens=-1)) == 16
    assert truncation_length(INFO, PoolingParams(truncate_prompt_tokens=5)) == 5
    with pytest.raises(InvalidRequest, match="greater than max_model_len"):
        check_params(INFO, PoolingParams(truncate_prompt_tokens=17))


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
