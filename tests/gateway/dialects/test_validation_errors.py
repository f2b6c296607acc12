"""vLLM's validation 400: pydantic's error type and the bad value in the message, the field in ``param``."""
import pytest

from poolgate.gateway.dialects.body import MAX_INPUT_CHARS, validated
from poolgate.gateway.dialects.openai import EmbeddingRequest
from poolgate.gateway.dialects.vllm_pooling import PoolingRequest
from poolgate.shared.domain.errors import InvalidRequest


@pytest.mark.parametrize("model", [EmbeddingRequest, PoolingRequest])
@pytest.mark.parametrize("field, bad", [("encoding_format", "hex"), ("embed_dtype", "int4"), ("endianness", "middle")])
def test_a_bad_encoding_field_names_literal_error_and_the_value(model, field, bad):
    with pytest.raises(InvalidRequest) as e:
        validated({"input": "x", field: bad}, model)
    err = e.value
    assert err.status == 400 and err.type == "Bad Request" and err.param == f"body.{field}"
    assert err.message.startswith(f"1 validation error:\n  body.{field}: Input should be ")
    assert f"[type=literal_error, input_value='{bad}', input_type=str]" in err.message


def test_a_long_bad_value_is_cut_and_a_missing_field_echoes_nothing():
    with pytest.raises(InvalidRequest) as e:
        validated({"input": "x", "encoding_format": "z" * 10_000}, EmbeddingRequest)
    assert "input_value='zzz" in e.value.message and len(e.value.message) < 300 + MAX_INPUT_CHARS
    with pytest.raises(InvalidRequest) as e:
        validated({}, EmbeddingRequest)
    assert e.value.message.endswith("body.input: Field required [type=missing]")
