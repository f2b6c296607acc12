"""The sinks: what a re-run reads as done from the files themselves, cut lines, Parquet parts and rows."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from poolgate.gateway.jobs.lines import Line, dumps, error_line, output_line
from poolgate.gateway.jobs.sinks import JsonlSink, line_key, parquet_rows, repair_tail, scan_jsonl

pq = pytest.importorskip("pyarrow.parquet", reason="Parquet output needs pyarrow (the jobs extra)")


def embed_line(custom_id: str, number: int = 1) -> Line:
    return Line(number, custom_id, "/v1/embeddings", {"input": ["x"]})


def embed_body(*vectors: list[float], b64: bool = False) -> dict:
    def enc(v):
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if b64 else v

    return {"data": [{"index": i, "embedding": enc(v)} for i, v in enumerate(vectors)], "usage": {"prompt_tokens": 3}}


def test_repair_tail_cuts_a_line_a_kill_left_half_written(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')
    repair_tail(path)
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n'
    path.write_bytes(b'{"only":')
    repair_tail(path)
    assert path.read_bytes() == b""
    path.write_bytes(b"x" * 200_000)  # a cut line longer than one read block
    repair_tail(path)
    assert path.read_bytes() == b""


def test_line_key_reads_custom_ids_with_any_characters(tmp_path):
    for custom_id in ["plain", 'quo"te', "uni\u00e9\u4e2d", "back\\slash", "x" * 512]:
        raw = dumps(output_line(custom_id, 200, "r", {"data": [{"embedding": [0.5] * 384}]}))
        assert line_key(raw) == custom_id
    assert line_key(dumps(error_line(4, None, "c", "m"))) == 4
    assert line_key(b"not json\n") is None


def test_jsonl_sink_resumes_from_its_own_files(tmp_path):
    out, err = tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl"
    sink = JsonlSink(out, err)
    assert sink.done == set()
    sink.write_ok(embed_line("a"), 200, "r1", embed_body([1.0]))
    sink.write_error(error_line(2, None, "invalid_request", "bad"))
    sink.write_error(error_line(3, "c", "BadRequestError", "no", status=400, request_id="r3", body={}))
    sink.close(finished=False)
    with out.open("ab") as f:  # a kill in the middle of the next write
        f.write(b'{"id":"batch_req_1","custom_id":"d","resp')
    again = JsonlSink(out, err)
    assert again.done == {"a", 2, "c"}
    again.close(finished=True)
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == ["a"]
    assert scan_jsonl(tmp_path / "missing.jsonl") == set()


@pytest.mark.parametrize(
    ("url", "body", "kind", "indexes", "columns"),
    [
        ("/classify", {"data": [{"index": 0, "label": "pos", "probs": [0.2, 0.8]}]}, "classify", [0],
         {"label": ["pos"]}),
        ("/score", {"data": [{"index": 0, "score": 0.5}, {"index": 1, "score": 0.25}]}, "score", [0, 1],
         {"score": [0.5, 0.25]}),
        ("/v2/rerank", {"results": [{"index": 2, "relevance_score": 0.9}]}, "rerank", [2],
         {"relevance_score": [0.9]}),
    ],
)
def test_parquet_rows_of_each_route_kind(url, body, kind, indexes, columns):
    got_kind, got_indexes, got = parquet_rows(url, body)
    assert (got_kind, got_indexes) == (kind, indexes)
    for name, values in columns.items():
        assert got[name] == values


def test_parquet_rows_refuse_routes_without_rows():
    with pytest.raises(ValueError, match="Parquet output takes the answers of"):
        parquet_rows("/pooling", {"data": []})


def test_parquet_sink_writes_parts_resumes_and_joins(tmp_path):
    from poolgate.gateway.jobs.sinks import ParquetSink

    out, err = tmp_path / "o.parquet", tmp_path / "o.errors.jsonl"
    sink = ParquetSink(out, err, part_lines=2)
    assert sink.write_ok(embed_line("a"), 200, "r", embed_body([1, 2, 3], [4, 5, 6])) is None
    assert sink.write_ok(embed_line("b"), 200, "r", embed_body([7, 8, 9], b64=True)) is None  # a part is full
    assert sink.write_ok(embed_line("c"), 200, "r", embed_body([0, 0, 1])) is None  # held, not yet in a part
    assert "fixed-size" in sink.write_ok(embed_line("d"), 200, "r", embed_body([1, 2]))
    assert "holds embedding rows" in sink.write_ok(
        Line(5, "e", "/score", {}), 200, "r", {"data": [{"index": 0, "score": 1.0}]})
    # killed here: "c" was never in a whole part, so a re-run redoes it
    again = ParquetSink(out, err, part_lines=2)
    assert again.done == {"a", "b"}
    assert again.write_ok(embed_line("c"), 200, "r", embed_body([0, 0, 1])) is None
    again.close(finished=True)
    table = pq.read_table(out)
    assert table.column("custom_id").to_pylist() == ["a", "a", "b", "c"]
    assert table.column("index").to_pylist() == [0, 1, 0, 0]
    kind = table.schema.field("embedding").type
    assert (kind.list_size, str(kind.value_type)) == (3, "float")
    np.testing.assert_array_equal(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)),
                                  [[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 1]])
    assert not (tmp_path / "o.parquet.parts").exists()
    finished = ParquetSink(out, err)  # a finished file is read as done, and joined again unchanged
    assert finished.done == {"a", "b", "c"}
    finished.close(finished=True)
    assert pq.read_table(out).num_rows == 4
