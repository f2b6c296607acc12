"""The OpenAI dialect's pure conversions (request -> ServeRequest, result -> body) and serving policy."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from poolgate.gateway.dialects.envelope import usage
from poolgate.gateway.dialects.body import validation_error
from poolgate.gateway.dialects.openai import EmbeddingRequest, to_request, to_response
from poolgate.gateway.serving import Served, deadline, with_policy
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import check_inputs
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.messages import PoolingResult
from tests.fakes import fake_model

INFO = fake_model().info


def convert(body: dict):
    return to_request(EmbeddingRequest.model_validate(body))


@pytest.mark.parametrize("value, inputs", [
    ("one text", ["one text"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_input_forms_become_a_list_of_inputs(value, inputs):
    req = convert({"input": value, "model": "m"})
    assert req.inputs == inputs and req.model == "m"
    assert convert({"input": value}).model is None


@pytest.mark.parametrize("value", [
    ["1", 2], [1, "2"], [True], [1.5], [[1], ["a"]], {"a": 1}, 7, None, [-1], [2**40],
    [[[1]]],
])
def test_inputs_that_are_neither_texts_nor_token_ids_are_refused(value):
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"input": value})


def test_strings_of_digits_stay_texts():
    assert convert({"input": ["1", "2"]}).inputs == ["1", "2"]


def test_empty_input_is_vllms_400():
    with pytest.raises(InvalidRequest, match="You must pass at least one prompt"):
        check_inputs(INFO, convert({"input": []}).inputs)


def test_request_timeout_becomes_the_deadline():
    assert deadline(GatewayConfig(request_timeout_s=5.0), now=1000.0) == 1005.0
    assert deadline(GatewayConfig(request_timeout_s=None), now=1000.0) is None


def test_params_are_carried_and_extras_ignored():
    call = convert({"input": "x", "dimensions": 4, "use_activation": False,
                    "truncate_prompt_tokens": 5, "user": "u", "surprise": {"a": 1}})
    assert call.params == PoolingParams(task="embed", dimensions=4, use_activation=False,
                                        truncate_prompt_tokens=5)


def test_auto_truncate_fills_only_a_missing_truncation():
    def truncation(body: dict, auto_truncate: bool) -> int | None:
        return with_policy(GatewayConfig(auto_truncate=auto_truncate), convert(body).params).truncate_prompt_tokens

    assert truncation({"input": "x"}, False) is None
    assert truncation({"input": "x"}, True) == -1
    assert truncation({"input": "x", "truncate_prompt_tokens": 3}, True) == 3


def test_removed_normalize_param_has_vllms_message():
    with pytest.raises(InvalidRequest, match="Parameter `normalize` was removed"):
        convert({"input": "x", "normalize": True})


def test_validation_error_message_and_param_follow_vllm():
    with pytest.raises(ValidationError) as info:
        EmbeddingRequest.model_validate({"input": "x", "encoding_format": "hex"})
    err = validation_error(info.value)
    assert err.message.startswith("1 validation error:\n  body.encoding_format: ")
    assert err.param == "body.encoding_format" and err.status == 400


def test_validation_error_lists_at_most_a_few_errors():
    with pytest.raises(ValidationError) as info:
        EmbeddingRequest.model_validate({"input": [None] * 50})
    message = validation_error(info.value).message
    assert message.count("\n") <= 6 and "more" in message


def result(*vectors) -> Served:
    """Served as a worker sends it: one (n, dim) block for the whole call."""
    outputs = Rows(np.asarray(vectors, dtype=np.float32))
    return Served("rid", fake_model(name="m").info, PoolingResult(outputs=outputs, prompt_tokens=[3, 4]))


def test_float_response_shape_and_usage():
    body = to_response(result([0.1, -2.0], [3.5, 1e-8]), encoding_format="float", created=123)
    assert {k: body[k] for k in ("id", "object", "created", "model")} == {
        "id": "embd-rid", "object": "list", "created": 123, "model": "m"}
    assert body["usage"] == usage(7)
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert np.asarray(body["data"][1]["embedding"], dtype=np.float32).tolist() == \
        np.asarray([3.5, 1e-8], dtype=np.float32).tolist()


def test_base64_is_the_raw_little_endian_float32_bytes():
    vector = np.asarray([0.1, -2.0, 3.25], dtype=np.float64)  # converted to float32
    body = to_response(result(vector, vector[::-1]), encoding_format="base64", created=1)
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert raw == vector.astype("<f4").tobytes()
    assert base64.b64decode(body["data"][1]["embedding"]) == vector[::-1].astype("<f4").tobytes()


def test_float_body_round_trips_the_float32_values():
    from poolgate.gateway.dialects import encoding

    vectors = result([0.1, 1 / 3], [2.5, -1e-8])
    body = encoding.dumps(to_response(vectors, encoding_format="float", created=1))
    as_f32 = [np.float32(d["embedding"]).tolist() for d in json.loads(body)["data"]]
    assert as_f32 == [np.float32(v).tolist() for v in ([0.1, 1 / 3], [2.5, -1e-8])]


def test_gateway_imports_without_torch():
    code = "import sys, poolgate.gateway.app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
