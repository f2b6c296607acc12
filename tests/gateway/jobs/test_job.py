"""run_job over a sender that answers from a script, and the Sender against a real aiohttp server."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from poolgate.gateway.jobs.job import Counts, all_done, read_lines, run_job
from poolgate.gateway.jobs.lines import Line
from poolgate.gateway.jobs.sender import Answer, GatewayGone, NotAllowed, Sender, tokens_of
from poolgate.gateway.jobs.sinks import JsonlSink


def request(custom_id: str, url: str = "/v1/embeddings", **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body or {"input": custom_id}})


class Scripted:
    """Answers each line with 200 (usage: 2 tokens) unless its input says otherwise; can die after N lines."""

    def __init__(self, die_after: int | None = None):
        self.sent: list[str] = []
        self.die_after = die_after

    async def send(self, line: Line, extra_headers=None) -> Answer:
        if self.die_after is not None and len(self.sent) >= self.die_after:
            raise GatewayGone("gone")
        self.sent.append(line.custom_id)
        await asyncio.sleep(0)
        if line.body.get("input") == "refused":
            return Answer(400, "rid", {"error": {"message": "no", "type": "BadRequestError", "code": 400}})
        return Answer(200, "rid", {"data": [{"index": 0, "embedding": [1.0]}], "usage": {"prompt_tokens": 2}})


def write_input(path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n\n")  # a blank line at the end is skipped


def outputs(tmp_path) -> tuple[list, list]:
    out = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    err = [json.loads(x) for x in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    return out, err


async def job(tmp_path, sender, counts=None) -> Counts:
    sink = JsonlSink(tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl")
    try:
        return await run_job(read_lines(tmp_path / "in.jsonl"), sink, sender, counts or Counts(), max_inflight=4)
    finally:
        sink.close(True)


async def test_every_line_is_written_once_and_bad_lines_do_not_stop_the_job(tmp_path):
    write_input(tmp_path / "in.jsonl", [request("a"), "{oops", request("b", input="refused"), request("a"),
                                        request("c", url="/v1/nope"), request("d")])
    counts = await job(tmp_path, Scripted())
    assert (counts.completed, counts.failed, counts.skipped, counts.tokens) == (2, 4, 0, 4)
    out, err = outputs(tmp_path)
    assert sorted(o["custom_id"] for o in out) == ["a", "d"]
    by_line = {e["error"]["line"]: e for e in err}
    assert set(by_line) == {2, 3, 4, 5}
    assert by_line[2]["custom_id"] is None and "not valid JSON" in by_line[2]["error"]["message"]
    assert by_line[3]["response"]["status_code"] == 400 and by_line[3]["error"]["code"] == "BadRequestError"
    assert by_line[4]["error"]["code"] == "duplicate_custom_id" and by_line[4]["custom_id"] is None
    assert by_line[5]["custom_id"] == "c" and "not a batch route" in by_line[5]["error"]["message"]


async def test_a_job_stopped_midway_goes_on_where_it_stopped(tmp_path):
    ids = [f"r{i}" for i in range(50)]
    write_input(tmp_path / "in.jsonl", [request(i) for i in ids] + ["{bad", request("r3")])
    with pytest.raises(GatewayGone):
        await job(tmp_path, Scripted(die_after=20))
    first, _ = outputs(tmp_path)
    assert 0 < len(first) <= 20
    second = Scripted()
    counts = await job(tmp_path, second)
    out, err = outputs(tmp_path)
    assert sorted(o["custom_id"] for o in out) == sorted(ids)  # each exactly once
    assert set(second.sent).isdisjoint(o["custom_id"] for o in first)
    assert counts.skipped == len(first) and counts.completed == 50 - len(first)
    third = Scripted()  # everything done: nothing is sent, nothing written again
    counts = await job(tmp_path, third)
    assert third.sent == [] and counts.skipped == 52 and outputs(tmp_path) == (out, err)
    sink = JsonlSink(tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl")
    sink.close(True)
    assert all_done(read_lines(tmp_path / "in.jsonl"), sink.done)  # keyed as run_job writes them (bad, duplicate)
    assert not all_done(read_lines(tmp_path / "in.jsonl"), sink.done - {"r7"})
    assert not all_done(read_lines(tmp_path / "in.jsonl"), sink.done - {52})  # the second "r3" line, by number


def test_tokens_of_each_usage_shape():
    assert tokens_of({"usage": {"prompt_tokens": 5, "total_tokens": 5}}) == 5
    assert tokens_of({"usage": {"total_tokens": 7}}) == 7
    assert tokens_of({"meta": {"billed_units": {"input_tokens": 3}}}) == 3
    assert tokens_of({"data": []}) == 0 and tokens_of(None) == 0


async def serve(app: web.Application):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_sender_waits_out_429_and_503_retries_504_and_gives_the_rest_back():
    seen: list[dict] = []
    answers = [web.json_response({}, status=429, headers={"Retry-After": "1"}),
               web.json_response({}, status=503),
               web.json_response({"ok": 1}, headers={"X-Request-Id": "abc"}),
               web.json_response({}, status=504), web.json_response({}, status=504), web.json_response({}, status=504)]

    async def handler(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return answers.pop(0)

    app = web.Application()
    app.router.add_post("/v1/embeddings", handler)
    runner, url = await serve(app)
    try:
        async with Sender(url, headers={"Authorization": "Bearer k"}, line_timeout_s=30) as sender:
            line = Line(1, "a", "/v1/embeddings", {"input": "x"})
            started = asyncio.get_running_loop().time()
            answer = await sender.send(line)
            assert (answer.status, answer.request_id, answer.body) == (200, "abc", {"ok": 1})
            assert asyncio.get_running_loop().time() - started >= 2  # Retry-After 1 s, twice (at least 1 s each)
            assert (await sender.send(line)).status == 504  # three tries, then the line's answer
    finally:
        await runner.cleanup()
    assert len(seen) == 6
    assert seen[0]["X-Poolgate-Lane"] == "bulk" and seen[0]["X-Request-Timeout"] == "30"
    assert seen[0]["Authorization"] == "Bearer k"


async def test_sender_gives_up_on_a_gateway_that_never_answers():
    async with Sender("http://127.0.0.1:9", unreachable_s=0.5) as sender:
        with pytest.raises(GatewayGone, match="no answer from http://127.0.0.1:9"):
            await sender.send(Line(1, "a", "/v1/embeddings", {}))


async def test_sender_stops_the_job_when_the_key_is_refused():
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no key"}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/embeddings", refuse)
    runner, url = await serve(app)
    try:
        async with Sender(url) as sender:
            with pytest.raises(NotAllowed, match="refused the API key"):
                await sender.send(Line(1, "a", "/v1/embeddings", {}))
    finally:
        await runner.cleanup()


async def test_the_lines_in_flight_follow_the_cap_asked_before_each_line(tmp_path):
    write_input(tmp_path / "in.jsonl", [request(f"r{i}") for i in range(40)])

    class Counting(Scripted):
        def __init__(self):
            super().__init__()
            self.now = self.most = 0

        async def send(self, line, extra_headers=None):
            self.now += 1
            self.most = max(self.most, self.now)
            await asyncio.sleep(0.002)
            self.now -= 1
            return await super().send(line, extra_headers)

    for cap, expected in [(None, 8), (2, 2), (0, 1)]:  # no cap: max_inflight; a cap below it; never below 1
        for path in (tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl"):
            path.unlink(missing_ok=True)
        sender = Counting()
        sink = JsonlSink(tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl")
        counts = await run_job(read_lines(tmp_path / "in.jsonl"), sink, sender, Counts(), max_inflight=8,
                               inflight=None if cap is None else (lambda cap=cap: cap))
        sink.close(True)
        assert counts.completed == 40 and sender.most == expected
