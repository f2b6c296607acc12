"""The vLLM-native dialects' pure parts: request bodies, the task /pooling runs, labels, the envelope."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.gateway.dialects import vllm_classify, vllm_pooling
from poolgate.gateway.dialects.envelope import list_response
from poolgate.gateway.dialects.io_processor import NO_PLUGIN
from poolgate.gateway.serving import Served
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.messages import PoolingResult
from tests.fakes import fake_model


def info(*tasks):
    return fake_model(tasks=tasks).info


def test_pooling_task_choice_and_its_400s():
    assert vllm_pooling.pooling_task(info("embed", "token_embed"), None) == "embed"
    assert vllm_pooling.pooling_task(info("token_embed", "embed"), None) == "token_embed"  # the worker's first
    assert vllm_pooling.pooling_task(info("embed", "token_embed"), "token_embed") == "token_embed"  # not active
    with pytest.raises(InvalidRequest, match=r"Unsupported task: 'classify' Supported tasks: \('embed',\)") as err:
        vllm_pooling.pooling_task(info("embed"), "classify")
    assert err.value.status == 400 and err.value.param == "task"
    with pytest.raises(InvalidRequest, match="only available through an IO processor plugin"):
        vllm_pooling.pooling_task(info("embed&token_classify", "embed"), None)


@pytest.mark.parametrize("plugin", [None, "similarity"])
def test_task_plugin_is_unsupported_before_any_plugin_check(plugin):
    with pytest.raises(InvalidRequest) as err:
        vllm_pooling.pooling_task(info("embed", "token_embed"), "plugin", plugin)
    assert err.value.message == "Unsupported task: 'plugin' Supported tasks: ('embed', 'token_embed')"
    assert err.value.param == "task"


def test_a_model_that_serves_the_plugin_task_takes_its_inputs_from_a_plugin():
    with pytest.raises(InvalidRequest) as err:
        vllm_pooling.pooling_task(info("plugin"), None)  # its active task
    assert err.value.message == NO_PLUGIN
    with pytest.raises(InvalidRequest) as err:
        vllm_pooling.pooling_task(info("embed", "plugin"), "plugin", "similarity")
    assert err.value.message == vllm_pooling.PLUGIN_BODY


def test_pooling_request_carries_the_params():
    req = vllm_pooling.PoolingRequest.model_validate(
        {"input": [[1, 2], [3]], "model": "m", "task": "token_embed", "use_activation": False,
         "truncate_prompt_tokens": 4, "embed_dtype": "float32"})
    call = vllm_pooling.to_request(req, info("embed", "token_embed"))
    assert call.model == "m" and call.inputs == [[1, 2], [3]]
    assert call.params == PoolingParams(task="token_embed", use_activation=False, truncate_prompt_tokens=4)


def test_classify_request_ignores_dimensions():
    req = vllm_classify.ClassificationRequest.model_validate({"input": "x", "dimensions": 3, "use_activation": True})
    assert vllm_classify.to_request(req).params == PoolingParams(task="classify", use_activation=True)


@pytest.mark.parametrize("body", [{"input": "x", "normalize": True}, {"input": "x", "task": "score"}])
def test_removed_names_are_refused_before_the_fields_are_checked(body):
    with pytest.raises(InvalidRequest, match="removed"):
        vllm_classify.ClassificationRequest.model_validate({**body, "input": 5})


def test_label_is_the_argmax_or_none():
    probs = np.float32([0.1, 0.7, 0.2])
    assert vllm_classify.label_of(probs, ("a", "b", "c")) == "b"
    assert vllm_classify.label_of(probs, None) is None
    assert vllm_classify.label_of(probs, ("a",)) is None  # fewer names than outputs: no guess


def served(values, offsets=None) -> Served:
    rows = Rows(np.asarray(values, dtype=np.float32), offsets if offsets is None else np.asarray(offsets))
    return Served("rid", fake_model(name="m").info, PoolingResult(outputs=rows, prompt_tokens=[2, 3]))


def test_envelope():
    body = list_response("pooling", served([[1.0], [2.0]]), [{"x": 1}], created=5)
    assert body == {"id": "pooling-rid", "object": "list", "created": 5, "model": "m", "data": [{"x": 1}],
                    "usage": {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0,
                              "prompt_tokens_details": None, "completion_tokens_details": None}}


def test_token_rows_become_nested_lists_per_input():
    s = served([[1, 2], [3, 4], [5, 6]], offsets=[0, 1, 3])
    body = vllm_pooling.to_response(s, encoding_format="float", created=1)
    assert [np.asarray(d["data"]).tolist() for d in body["data"]] == [[[1, 2]], [[3, 4], [5, 6]]]
