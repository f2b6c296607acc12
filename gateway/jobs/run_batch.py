"""``poolgate run-batch -i INPUT -o OUTPUT``: a file of requests (OpenAI's batch JSONL) run to a file of answers.

vLLM's command, for poolgate's routes (``gateway.jobs.lines``: the line
format and which urls). Two ways to run:

- on a model, in this process (no ``--url``): MODEL and every ``poolgate
  serve`` flag say what to serve, and a gateway of the job's own runs it
  behind a private unix socket (``gateway.jobs.private``), its workers as
  ``serve`` starts them;
- against a running gateway (``--url http://host:8000``, with ``--api-key``
  when it needs one). Unlike vLLM's ``--url`` (a deprecated alias of its
  metrics host), ours is the server the lines go to.

Either way each line is the HTTP request it describes (``gateway.jobs.sender``),
in the bulk lane below every live request. Successes go to OUTPUT (JSONL in
OpenAI's batch output shape, or ``--output-format parquet``: one row per
vector or score, vectors as fixed-size float32 lists), failures to
``--error-file`` (default ``OUTPUT``'s name with ``.errors.jsonl``) with their
reason; the job goes on. Re-running the same command after a crash, a kill or
Ctrl-C goes on where it stopped: what is done is read from the two files
(``gateway.jobs.sinks``), so no line is written twice. Progress: a bar on a
terminal, a line every ``--progress-every`` seconds otherwise, and a summary.

Exit code: 0 when every line is done (failed lines included: they are in
the error file), 1 when the job stopped before (the gateway gone or refusing the API key,
the model did not start), 2 for bad flags, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from poolgate.gateway import serve
from poolgate.gateway.jobs.job import Counts, all_done, count_lines, read_lines, run_job
from poolgate.gateway.jobs.progress import Progress
from poolgate.gateway.jobs.sender import JobStopped, Sender
from poolgate.gateway.jobs.sinks import JsonlSink, ParquetSink, Sink
from poolgate.shared.config.flags import positive_int
from poolgate.shared.config.frozen import GatewayConfig

log = logging.getLogger("poolgate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    job = p.add_argument_group("the job")
    job.add_argument("-i", "--input-file", required=True, type=Path, help="OpenAI batch JSONL: one request a line")
    job.add_argument("-o", "--output-file", required=True, type=Path, help="the answers (appended; a re-run resumes)")
    job.add_argument(
        "--error-file",
        type=Path,
        default=None,
        help="the failed lines, JSONL (default: OUTPUT's name with .errors.jsonl)",
    )
    job.add_argument(
        "--output-format",
        choices=("jsonl", "parquet"),
        default="jsonl",
        help="parquet: one row per vector / score / label (needs pyarrow), for corpora",
    )
    job.add_argument(
        "--url",
        default=None,
        help="a running gateway (http://host:port) to send the lines to; without it, MODEL is served "
        "in this process on a private socket",
    )
    job.add_argument(
        "--max-inflight",
        type=positive_int,
        default=64,
        help="lines in flight at once (the rest wait here, not in the gateway's queue)",
    )
    job.add_argument(
        "--line-timeout", type=float, default=600.0, help="seconds one line may take in the gateway (X-Request-Timeout)"
    )
    job.add_argument(
        "--unreachable-timeout",
        type=float,
        default=600.0,
        help="seconds without any answer from the gateway before the job stops (re-run to resume)",
    )
    job.add_argument(
        "--lane",
        choices=("bulk", "live"),
        default="bulk",
        help="bulk: the lines run below every live request (X-Poolgate-Lane)",
    )
    job.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        help="seconds between progress lines when stderr is not a terminal",
    )
    serve.add_arguments(p)  # MODEL and the serve flags, for the in-process gateway (--api-key: also --url's key)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source, output = args.input_file, args.output_file
    errors = args.error_file or output.with_name(output.name.rsplit(".", 1)[0] + ".errors.jsonl")
    if not source.is_file():
        log.error("no input file %s", source)
        return 2
    if len({source.resolve(), output.resolve(), errors.resolve()}) < 3:
        log.error("the input, output and error files must be three different files")
        return 2
    for path in (output, errors):
        if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
            log.error("cannot write %s: its folder is missing or not writable", path)
            return 2
    config = None
    if args.url is None:
        try:
            config = serve.config_from_args(args)
        except (OSError, ValueError) as exc:
            log.error("%s", exc)
            return 2
        if config.batch is not None:
            log.error("--batch-dir turns on the Batch API of `poolgate serve`; run-batch runs its one file")
            return 2
    try:
        return asyncio.run(_run(args, config, source, output, errors))
    except KeyboardInterrupt:
        print(f"stopped; run the same command again to go on ({output})", file=sys.stderr)
        return 130


async def _run(args: argparse.Namespace, config: GatewayConfig | None, source: Path, output: Path, errors: Path) -> int:
    if args.output_format == "parquet":
        try:
            sink: Sink = ParquetSink(output, errors)
        except ImportError:
            log.error("--output-format parquet needs pyarrow (pip install 'poolgate[jobs]')")
            return 2
    else:
        sink = JsonlSink(output, errors)
    counts = Counts(total=count_lines(source))
    if len(sink.done) >= counts.total and all_done(read_lines(source), sink.done):
        sink.close(True)  # (a Parquet job killed while joining its parts: joined now)
        print(f"nothing to do: every line of {source} is in {output} or {errors}", file=sys.stderr)
        return 0
    key = args.api_key or os.environ.get("POOLGATE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    options = {
        "headers": headers,
        "line_timeout_s": args.line_timeout,
        "unreachable_s": args.unreachable_timeout,
        "lane": args.lane,
        "connections": args.max_inflight,
    }
    finished = False
    try:
        if config is None:
            sender = Sender(args.url, **options)
            finished = await _lines(args, source, sink, sender, counts)
        else:
            from poolgate.gateway.jobs.private import StartFailed, private_gateway

            try:
                async with private_gateway(config) as socket:
                    finished = await _lines(args, source, sink, Sender(unix=socket, **options), counts)
            except StartFailed as exc:
                log.error("%s", exc)
    finally:
        sink.close(finished)
    if not finished:
        return 1
    print(
        f"done: {counts.completed:,} lines to {output}, {counts.failed:,} failed lines to {errors}"
        + (f", {counts.skipped:,} done before" if counts.skipped else ""),
        file=sys.stderr,
    )
    return 0


async def _lines(args: argparse.Namespace, source: Path, sink: Sink, sender: Sender, counts: Counts) -> bool:
    progress = Progress(counts, every_s=args.progress_every)
    try:
        async with sender:
            await run_job(read_lines(source), sink, sender, counts, max_inflight=args.max_inflight)
        return True
    except JobStopped as exc:
        log.error("%s; run the same command again to go on", exc)
        return False
    finally:
        progress.close(counts)
