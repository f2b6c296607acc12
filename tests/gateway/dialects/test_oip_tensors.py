"""The Open Inference Protocol's tensor codec: every datatype round-trips through JSON data and raw bytes, the raw
layout is tritonclient's own, and what does not fit the shape or the datatype is a 400 naming the tensor."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from poolgate.gateway.dialects.oip_tensors import (
    DATATYPES,
    Tensor,
    from_data,
    from_raw,
    tensor,
    to_data,
    to_raw,
)
from poolgate.shared.domain.errors import InvalidRequest

SAMPLES = {
    "BOOL": [[True, False, True], [False, False, True]],
    "UINT8": [[0, 255, 7], [1, 2, 3]],
    "UINT16": [[0, 65535, 7], [1, 2, 3]],
    "UINT32": [[0, 2**32 - 1, 7], [1, 2, 3]],
    "UINT64": [[0, 2**64 - 1, 7], [1, 2, 3]],
    "INT8": [[-128, 127, 0], [1, -2, 3]],
    "INT16": [[-(2**15), 2**15 - 1, 0], [1, -2, 3]],
    "INT32": [[-(2**31), 2**31 - 1, 0], [1, -2, 3]],
    "INT64": [[-(2**63), 2**63 - 1, 0], [1, -2, 3]],
    "FP16": [[0.5, -1.25, 65504.0], [1, 2, 3]],
    "FP32": [[0.1, -1e30, 3.5], [1, 2, 3]],
    "FP64": [[0.1, -1e300, 3.5], [1, 2, 3]],
    "BYTES": [["héllo", "", "a b"], ["x", "\u4e16\u754c", "z"]],
}


def flat(values):
    return [v for row in values for v in row]


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_round_trips_through_json_data_and_raw_bytes(datatype):
    values = SAMPLES[datatype]
    t = from_data("x", datatype, [2, 3], flat(values))
    assert t.shape == (2, 3) and t.data.shape == (2, 3) and t.datatype == datatype
    assert from_data("x", datatype, [2, 3], values).data.tolist() == t.data.tolist()  # nested lists read row-major
    again = from_data("x", datatype, [2, 3], to_data(t))
    raw = from_raw("x", datatype, (2, 3), to_raw(t))
    assert again.data.tolist() == t.data.tolist() == raw.data.tolist()
    if datatype == "BYTES":
        assert to_data(t) == flat(values) and t.data[0, 0] == "héllo".encode()
    else:
        want = np.array(flat(values), dtype=DATATYPES[datatype]).reshape(2, 3)
        assert np.array_equal(t.data, want) and t.data.dtype == want.dtype
        assert to_raw(t) == want.astype(want.dtype.newbyteorder("<")).tobytes()


def test_the_raw_layout_is_tritonclients():
    texts = np.array([b"first", b"", "second \u00e9".encode()], dtype=object)
    wire = serialize_byte_tensor(texts).item()
    t = from_raw("text", "BYTES", [3], wire)
    assert t.data.tolist() == texts.tolist()
    assert to_raw(t) == wire == b"".join(struct.pack("<I", len(b)) + b for b in texts)
    assert deserialize_bytes_tensor(to_raw(t)).tolist() == texts.tolist()
    assert to_raw(from_data("b", "BOOL", [3], [True, False, True])) == b"\x01\x00\x01"  # one byte each
    assert from_raw("b", "BOOL", [2], b"\x00\x07").data.tolist() == [False, True]
    assert to_raw(from_data("f", "FP32", [1], [1.0])) == struct.pack("<f", 1.0)  # little-endian


def test_empty_tensors():
    assert from_data("x", "FP32", [0, 4], []).data.shape == (0, 4)
    assert from_raw("x", "BYTES", [0], b"").data.shape == (0,)
    assert to_raw(from_data("x", "BYTES", [0], [])) == b""


def bad(call, *args, match: str):
    with pytest.raises(InvalidRequest, match=match) as err:
        call(*args)
    assert err.value.status == 400
    return err.value


@pytest.mark.parametrize("datatype, match", [("BF16", "BF16 tensors are not supported"), ("FP8", "unknown datatype"),
                                             ("fp32", "unknown datatype"), ("STRING", "unknown datatype")])
def test_unknown_and_refused_datatypes_are_400_naming_the_tensor(datatype, match):
    err = bad(from_data, "my_input", datatype, [1], [1], match=match)
    assert "'my_input'" in err.message and err.param == "my_input"
    bad(from_raw, "my_input", datatype, [1], b"\x00\x00", match=match)


def test_counts_that_disagree_with_the_shape_are_400():
    bad(from_data, "t", "FP32", [2, 2], [1.0, 2.0, 3.0],
        match=r"tensor 't': shape \[2, 2\] holds 4 elements but the data has 3")
    bad(from_data, "t", "BYTES", [3], ["a", "b"], match="holds 3 elements")
    bad(from_raw, "t", "FP32", [2], b"\x00" * 12, match="takes 8 bytes but 12 were sent")
    bad(from_raw, "t", "INT64", [1], b"\x00" * 4, match="takes 8 bytes but 4 were sent")
    wire = serialize_byte_tensor(np.array([b"ab", b"cd"], dtype=object)).item()
    bad(from_raw, "t", "BYTES", [3], wire, match="holds 3 BYTES elements but the data has 2")
    bad(from_raw, "t", "BYTES", [1], wire, match="has 6 bytes after them")
    bad(from_raw, "t", "BYTES", [2], wire[:-1], match="element 1 says 2 bytes but the data ends first")
    bad(from_raw, "t", "BYTES", [2], wire + b"\x01", match="bytes after them")


@pytest.mark.parametrize("datatype, value, match", [
    ("INT32", 1.5, "is not a INT32 value"), ("INT32", True, "is not a INT32 value"), ("INT32", "1", "not a INT32"),
    ("INT8", 128, "out of range for INT8"), ("UINT8", -1, "out of range for UINT8"),
    ("UINT64", 2**64, "out of range"), ("BOOL", 1, "is not a BOOL value"), ("FP32", "0.5", "is not a FP32 value"),
    ("FP32", None, "is not a FP32"), ("FP16", 1e10, "out of range for FP16"), ("FP32", 1e39, "out of range for FP32"),
    ("BYTES", 5, "BYTES elements are strings"), ("FP64", False, "not a FP64"),
])
def test_values_of_the_wrong_type_or_range_are_400(datatype, value, match):
    bad(from_data, "v", datatype, [2], [value, value], match=match)


def test_a_shape_is_non_negative_integers():
    for shape in ([-1], [1.0], [True], ["2"]):
        bad(from_data, "s", "FP32", shape, [1.0], match="shape must be non-negative integers")


def test_bytes_that_are_not_utf8_go_raw():
    t = from_raw("b", "BYTES", [1], struct.pack("<I", 1) + b"\xff")
    assert t.data.tolist() == [b"\xff"]
    bad(to_data, t, match="not UTF-8 text: ask for it as binary data")
    assert to_raw(t) == struct.pack("<I", 1) + b"\xff"


def test_tensor_builds_an_output_of_its_data_as_shaped():
    t = tensor("e", "FP32", np.float64([[1, 2], [3, 4]]))
    assert t.shape == (2, 2) and t.data.dtype == np.float32
    labels = tensor("labels", "BYTES", ["pos", "neg"])
    assert labels.shape == (2,) and labels.data.tolist() == [b"pos", b"neg"] and to_data(labels) == ["pos", "neg"]
    assert Tensor("x", "FP32", (1,), np.float32([1])).parameters == {}
