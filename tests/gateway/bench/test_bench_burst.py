"""``poolgate bench --burst`` against an in-process fake that admits the first K requests and refuses the rest."""
from __future__ import annotations

import asyncio
import json

from aiohttp import web

from poolgate.gateway.bench.burst import BurstOutcome, burst_report, run_burst
from poolgate.gateway.bench.cli import main
from poolgate.gateway.bench.load import LoadConfig
from poolgate.shared.domain.corpus import synthetic_corpus
from tests.gateway.bench.test_bench_load import FakeEmbeddingServer, parse, start

HOLD_S = 0.1  # how long an admitted request takes


class AdmittingServer(FakeEmbeddingServer):
    """Holds every request until ``expected`` have arrived (a 500 if they do not within 2 s: a burst sent one
    at a time fails), then answers the first ``admit`` after HOLD_S and refuses the others with 429 and
    Retry-After 1, 2, 3, ..."""

    def __init__(self, expected: int, admit: int):
        super().__init__()
        self.expected, self.admit = expected, admit
        self.arrived = self.admitted = self.refused = 0
        self.all_here = asyncio.Event()

    async def embeddings(self, request: web.Request) -> web.Response:
        self.arrived += 1
        if self.arrived == self.expected:
            self.all_here.set()
        try:
            await asyncio.wait_for(self.all_here.wait(), 2.0)
        except TimeoutError:
            return web.json_response({"error": {"message": "not a burst"}}, status=500)
        if self.arrived > self.expected or self.admitted >= self.admit:
            self.refused += 1
            return web.json_response({"error": {"message": "queue full"}}, status=429,
                                     headers={"Retry-After": str(self.refused)})
        self.admitted += 1
        await asyncio.sleep(HOLD_S)
        return await super().embeddings(request)


async def test_burst_counts_admitted_and_refused_and_times_the_admitted():
    fake = AdmittingServer(expected=24, admit=10)
    runner, url = await start(fake)
    try:
        cfg = LoadConfig(url=url, model="fake-model", batch_size=4, warmup=0, timeout_s=10)
        report = await run_burst(cfg, synthetic_corpus(20, seed=2), 24, 5.0)
    finally:
        await runner.cleanup()
    assert (report["sent"], report["admitted"], report["refused"], report["errors"]) == (24, 10, 14, 0)
    assert report["refused_retry_after_p50_s"] == 7.5          # median of 1..14
    lat = report["admitted_latency_ms"]
    assert HOLD_S * 1000 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] < 3000
    assert report["max_queued_s"] == 5.0 and fake.inputs == 40   # 10 admitted x 4 inputs, 20 texts cycled


def test_report_counts_other_statuses_and_no_answer_as_errors():
    outcomes = [BurstOutcome(200, 0.5), BurstOutcome(500, 0.1), BurstOutcome(None, 0.2, error="timeout"),
                BurstOutcome(429, 0.01, retry_after_s=None)]
    report = burst_report(outcomes, LoadConfig(url="u", model="m"), None, 1.0)
    assert (report["admitted"], report["refused"], report["errors"]) == (1, 1, 2)
    assert report["error_kinds"] == {"HTTP 500": 1, "timeout": 1}
    assert report["refused_retry_after_p50_s"] is None and report["admitted_latency_ms"]["max"] == 500.0


async def test_cli_burst_prints_the_table_and_exits_by_errors(capsys):
    fake = AdmittingServer(expected=12, admit=12)
    runner, url = await start(fake)
    try:
        args = parse("--burst", "--url", url, "--burst-requests", "12", "--batch-size", "2", "--num-texts", "30",
                     "--warmup", "0", "--max-queued-s", "3")
        assert await asyncio.to_thread(main, args) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        report = json.loads(lines[-1])
        assert (report["mode"], report["model"], report["admitted"], report["refused"]) == ("burst", "fake-model", 12, 0)
        assert any("admission limit" in line and "3 s" in line for line in lines)
    finally:
        await runner.cleanup()


async def test_cli_burst_exits_1_when_requests_fail(capsys):
    runner, url = await start(AdmittingServer(expected=5, admit=5))
    try:
        args = parse("--burst", "--url", url, "--model", "fake-model", "--burst-requests", "3", "--warmup", "0")
        assert await asyncio.to_thread(main, args) == 1           # 3 of the 5 awaited: each a 500 after 2 s
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error_kinds"] == {"HTTP 500": 3}
    finally:
        await runner.cleanup()
