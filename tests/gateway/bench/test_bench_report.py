"""Benchmark statistics: percentiles, rates, the reference ratio and the table."""
from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from poolgate.gateway.bench.load import LoadConfig, LoadResult
from poolgate.gateway.bench.report import (add_reference, format_table, latency_ms, percentile, summarize,
                                  to_json)


def test_percentiles_on_known_numbers():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3


def test_percentile_agrees_with_numpy():
    rng = random.Random(0)
    values = [rng.expovariate(1.0) for _ in range(999)]
    for q in (50, 95, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_latency_in_milliseconds():
    lat = latency_ms([0.010, 0.020, 0.030])
    assert lat["p50"] == pytest.approx(20.0)
    assert lat["mean"] == pytest.approx(20.0) and lat["max"] == pytest.approx(30.0)
    assert latency_ms([]) == {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}


def _report(errors: Counter | None = None) -> dict:
    result = LoadResult(wall_s=2.0, requests=10, ok_requests=9, inputs=288, prompt_tokens=24_000,
                        latencies_s=[0.1] * 9, errors=errors or Counter(), embedding_dim=384)
    cfg = LoadConfig(url="http://h:1", model="m", batch_size=32, concurrency=4)
    return summarize(result, cfg, corpus="synthetic seed=0", num_texts=288)


def test_summarize_rates():
    report = _report(Counter({"HTTP 500": 1}))
    assert report["tokens_per_s"] == 12_000.0
    assert report["inputs_per_s"] == 144.0
    assert report["requests_per_s"] == 5.0
    assert report["errors"] == 1 and report["error_kinds"] == {"HTTP 500": 1}
    assert report["latency_ms"]["p99"] == pytest.approx(100.0)
    assert json.loads(to_json(report)) == report


def test_reference_ratio_and_table():
    st = {"tokens_per_s": 4_000.0, "inputs_per_s": 48.0, "prompt_tokens": 24_000, "inputs": 288,
          "wall_s": 6.0, "device": "cpu", "dtype": "float32", "batch_size": 32,
          "max_seq_length": 256}
    report = add_reference(_report(), st)
    assert report["ratio_vs_sentence_transformers"] == pytest.approx(3.0)
    table = format_table(report)
    assert "3.00x" in table and "sentence-transformers" in table
    rows = [line for line in table.splitlines() if line.startswith("  ") and "ms" in line]
    assert len({len(line) for line in rows}) == 1       # columns are aligned
    assert "12,000.0" in table and "4,000.0" in table


def test_table_lists_errors():
    table = format_table(_report(Counter({"HTTP 500": 1})))
    assert "error HTTP 500: 1" in table
    assert "sentence-transformers" not in table
