"""The Open Inference Protocol's parameters: the protocol's pass, Triton's unimplemented ones and unknown ones are
400s naming them, the request's and the inputs' maps merge, each kind's options are strict."""
from __future__ import annotations

import pytest

from poolgate.gateway.dialects.oip_parameters import (
    ClassifyOptions,
    EmbedOptions,
    ScoreOptions,
    check_output_parameters,
    merged,
    options,
)
from poolgate.shared.domain.errors import InvalidRequest


def test_the_protocols_parameters_are_left_out_and_the_maps_merge():
    got = merged([("the request", {"binary_data_output": True, "normalize": False}),
                  ("input 'text'", {"binary_data_size": 12, "dimensions": 4, "normalize": False})])
    assert got == {"normalize": False, "dimensions": 4}
    with pytest.raises(InvalidRequest, match="parameter 'normalize' is given twice with different values"):
        merged([("the request", {"normalize": False}), ("input 'text'", {"normalize": True})])


@pytest.mark.parametrize("key, value, match", [
    ("timeout", 100, "X-Request-Timeout"), ("sequence_id", 7, "stateless"), ("sequence_start", True, "stateless"),
    ("shared_memory_region", "r", "shared memory is not implemented"),
])
def test_tritons_unimplemented_parameters_are_refused(key, value, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        merged([("the request", {key: value})])
    assert err.value.param == key and "(the request)" in err.value.message


def test_a_sequence_parameter_that_says_no_sequence_is_no_request():
    assert merged([("the request", {"sequence_id": 0, "sequence_start": False, "sequence_end": False})]) == {}


def test_output_parameters_take_binary_data_only():
    check_output_parameters("embeddings", {"binary_data": True})
    with pytest.raises(InvalidRequest, match="classification extension"):
        check_output_parameters("embeddings", {"classification": 3})
    with pytest.raises(InvalidRequest, match="unknown parameter 'top_k' on output 'scores'"):
        check_output_parameters("scores", {"top_k": 3})


def test_options_are_strict_and_name_what_is_wrong():
    opts = options(EmbedOptions, "embedding", {"normalize": False, "dimensions": 4, "truncate": True, "priority": 0})
    assert isinstance(opts, EmbedOptions) and opts.truncation() == -1 and opts.call_priority() is None
    assert options(ScoreOptions, "reranker", {"truncate_prompt_tokens": 5, "priority": 3}).call_priority() == 3
    with pytest.raises(InvalidRequest, match="unknown parameters 'dimensions', 'x': reranker models take "
                                             "priority, truncate, truncate_prompt_tokens, raw_scores"):
        options(ScoreOptions, "reranker", {"dimensions": 4, "x": 1})
    for bad, match in (({"normalize": "true"}, "parameter 'normalize'"), ({"dimensions": 1.0}, "'dimensions'"),
                       ({"dimensions": 0}, "'dimensions'"), ({"truncation_direction": "up"}, "truncation_direction")):
        with pytest.raises(InvalidRequest, match=match):
            options(EmbedOptions, "embedding", bad)
    both = options(ClassifyOptions, "classifier", {"truncate": True, "truncate_prompt_tokens": 3})
    with pytest.raises(InvalidRequest, match="not both"):
        both.truncation()
