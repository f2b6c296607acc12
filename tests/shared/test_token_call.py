"""TokenCall: a call's ids as one int32 block with offsets, its type ids and keys beside them, across the wire."""
from __future__ import annotations

import json

import numpy as np
import pytest

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall
from poolgate.shared.wire.token_call import TokenCall
from tests.fakes import tokenized


def test_pack_keeps_each_sequence_and_only_the_blocks_it_needs():
    call = TokenCall.pack("r", "m", [[101, 7, 102], [101, 102]], params=PoolingParams(task="embed"), priority=2)
    assert call.ids.dtype == np.int32 and call.ids.tolist() == [101, 7, 102, 101, 102]
    assert call.offsets.tolist() == [0, 3, 5] and len(call) == 2 and call.lengths() == [3, 2]
    assert call.type_ids is None and call.attend is None  # every token segment 0 and a key: no block
    assert call.sequences() == [[101, 7, 102], [101, 102]]
    assert call.type_lists() == [None, None] and call.attend_lists() == [None, None]


def test_type_ids_and_keys_come_back_per_sequence():
    call = TokenCall.pack("r", "m", [[1, 2, 3], [4, 5]], type_ids=[[0, 1, 1], None], attend=[None, [True, False]])
    assert call.type_ids.dtype == np.int8 and call.type_ids.tolist() == [0, 1, 1, 0, 0]
    assert call.type_lists() == [[0, 1, 1], None] and call.attend_lists() == [None, [True, False]]


def test_the_wire_form_is_a_json_header_and_the_blocks():
    call = TokenCall.pack("r", "m", [[1, 2], [3]], type_ids=[[0, 1], [0]], deadline=12.5, priority=-1,
                          trace_context={"traceparent": "00-x"}, params=PoolingParams(task="classify"))
    header, arrays = call.to_wire()
    assert [a.tolist() for a in arrays] == [[1, 2, 3], [0, 2, 3], [0, 1, 0]]  # ids, offsets, type ids: no keys
    assert not any(isinstance(v, list) for v in header.values())  # no id list in the JSON header
    back = TokenCall.from_wire(json.loads(json.dumps(header)), arrays)
    assert back.sequences() == call.sequences() and back.type_lists() == call.type_lists()
    assert (back.deadline, back.priority, back.params.task, back.trace_context) == (12.5, -1, "classify",
                                                                                    {"traceparent": "00-x"})


def test_the_lane_crosses_the_wire_and_an_older_gateways_call_is_live():
    call = TokenCall.pack("r", "m", [[1, 2]], lane="bulk", priority=3)
    header, arrays = call.to_wire()
    back = TokenCall.from_wire(json.loads(json.dumps(header)), arrays)
    assert (back.lane, back.priority) == ("bulk", 3)
    assert TokenCall.pack("r", "m", [[1]]).lane == "live"
    del header["lane"]  # a gateway from before lanes sends none
    assert TokenCall.from_wire(header, arrays).lane == "live"
    with pytest.raises(ValueError, match="unknown lane 'batch'"):
        TokenCall.from_wire({**header, "lane": "batch"}, arrays)


def test_the_front_carries_the_calls_lane_into_its_token_call():
    call = PoolingCall(request_id="r", model="m", inputs=["a b"], lane="bulk")
    assert tokenized(call).lane == "bulk"
    assert tokenized(PoolingCall(request_id="r", model="m", inputs=["a"])).lane == "live"


@pytest.mark.parametrize("offsets", [[0, 3], [1, 2], [0, 2, 1, 2]])
def test_blocks_that_do_not_fit_together_are_refused(offsets):
    header, _ = TokenCall.pack("r", "m", [[1, 2]]).to_wire()
    with pytest.raises(ValueError):
        TokenCall.from_wire(header, [np.array([1, 2], np.int32), np.array(offsets, np.int64)])


def test_ids_must_be_int32():
    header, _ = TokenCall.pack("r", "m", [[1, 2]]).to_wire()
    with pytest.raises(ValueError, match="int32"):
        TokenCall.from_wire(header, [np.array([1, 2], np.int64), np.array([0, 2], np.int64)])
