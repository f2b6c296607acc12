"""``poolgate bench`` flags and entry point: corpus, HTTP run, optional ST baseline, report.

Prints an aligned table, then the report as one JSON line (the last line of
stdout), and writes it to ``--json`` when given. Exits 0 when every timed
request succeeded, 1 when any failed, 2 when the run could not start.
With ``--kill-worker-after S --gateway-pid PID`` one worker of that gateway is
SIGKILLed S seconds into the run and the recovery timed (``bench.failover``).
With ``--model A --model B`` each model is loaded alone, then all at once, and
their tokens/s compared (``bench.mixed``). ``--latency`` sends one request at a
time with one input of ``--latency-tokens`` tokens (a different text each time):
the single-request latency percentiles. ``--gateway-only`` measures the gateway
alone against a zero-cost worker it starts itself (``bench.gateway_only``).
``--burst`` sends ``--burst-requests`` requests at once and counts how many the
admission takes and refuses (``bench.burst``). ``--jobs`` runs the same requests live, as
a job through the gateway and as an in-process ``run-batch``; ``--beside-job
LINES`` measures live latency beside a Batch API job (``bench.jobs``).
``--images N`` sends N synthetic images, one per request in vLLM's chat form,
and reports images/s and tokens/s (``bench.images``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import aiohttp

from poolgate.gateway.bench.accuracy import Fp32, check_cosine, reference
from poolgate.gateway.bench.burst import format_burst, run_burst
from poolgate.gateway.bench.failover import KillPlan, format_failover, run_with_kill
from poolgate.gateway.bench.gateway_only import format_gateway_only, run_gateway_only
from poolgate.gateway.bench.grpc import add_grpc_arguments, format_grpc, grpc_report
from poolgate.gateway.bench.images import add_image_arguments, image_corpus, image_payloads, image_urls
from poolgate.gateway.bench.jobs import add_jobs_arguments, format_beside, format_jobs, run_beside_job, run_jobs_compare
from poolgate.gateway.bench.load import BadResponse, LoadConfig, first_model_id, run_load
from poolgate.gateway.bench.mixed import alone_then_together, format_mixed, mixed_report, per_model
from poolgate.gateway.bench.peers import add_peer_arguments, format_peers, run_peers
from poolgate.gateway.bench.report import add_reference, format_table, summarize, to_json
from poolgate.gateway.bench.tokenizing import format_tokenizer_only, run_tokenizer_only
from poolgate.shared.config.flags import positive_int as _positive_int
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.model_settings import DTYPE_CHOICES
from poolgate.shared.domain.corpus import fixed_length_corpus, read_corpus, synthetic_corpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``poolgate bench``."""
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="model name (default: first id of GET /v1/models); give it again for several models "
        "of one gateway: each is loaded alone, then all at once (bench.mixed)",
    )
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--batch-size", type=_positive_int, default=32, help="inputs per request")
    parser.add_argument("--concurrency", type=_positive_int, default=8, help="requests in flight")
    parser.add_argument("--encoding-format", choices=("base64", "float"), default="base64")
    parser.add_argument(
        "--float",
        dest="encoding_format",
        action="store_const",
        const="float",
        help="shorthand for --encoding-format float",
    )
    parser.add_argument("--corpus", default=None, help="text file, one input per line")
    parser.add_argument("--num-texts", type=_positive_int, default=4096, help="synthetic corpus size")
    parser.add_argument("--seed", type=int, default=0, help="synthetic corpus seed")
    parser.add_argument("--warmup", type=int, default=4, help="untimed requests before the run")
    run = parser.add_mutually_exclusive_group()
    run.add_argument("--passes", type=_positive_int, default=1, help="whole-corpus passes")
    run.add_argument("--duration", type=float, default=None, help="run for SECONDS instead of passes")
    parser.add_argument(
        "--no-truncate",
        dest="truncate",
        action="store_false",
        help="do not send truncate_prompt_tokens=-1 (over-long inputs then get 400)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON report here")
    mode = parser.add_argument_group("modes")
    mode.add_argument(
        "--latency",
        action="store_true",
        help="single-request latency: one request in flight, one input of --latency-tokens tokens each",
    )
    mode.add_argument(
        "--latency-tokens",
        type=_positive_int,
        default=16,
        help="tokens per --latency input, [CLS]/[SEP] included (one synthetic word is one token)",
    )
    mode.add_argument(
        "--gateway-only",
        action="store_true",
        help="start a gateway and a zero-cost worker on 127.0.0.1 and measure the gateway alone "
        "(1 and 32 inputs per request, float and base64); --url and --model are not used",
    )
    mode.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="measure the gateway's input stage alone, in this process: the bundled model's tokenizer over the "
        "corpus in calls of --batch-size, on 1 and --tokenizer-threads threads; --url and --model are not used",
    )
    mode.add_argument(
        "--tokenizer-threads",
        type=_positive_int,
        default=2,
        metavar="N",
        help="with --tokenizer-only: the most threads tokenizing at once (as the gateway's tokenizer pool)",
    )
    mode.add_argument(
        "--zero-cost-tokenizer",
        choices=("model", "words"),
        default="model",
        help="with --gateway-only: the tokenizer the gateway runs, the bundled MiniLM's (model) or a whitespace "
        "split (words: the gateway without tokenizing)",
    )
    mode.add_argument(
        "--gateway-processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="with --gateway-only: then the same with serve --gateway-processes N (N gateway processes on one "
        "port), sharing the worker",
    )
    mode.add_argument(
        "--burst",
        action="store_true",
        help="send --burst-requests requests of --batch-size inputs at once to --url; count the admitted (200) "
        "and refused (429) and the admitted latency against the admission limit (bench.burst)",
    )
    mode.add_argument("--burst-requests", type=_positive_int, default=200, metavar="N", help="requests in the burst")
    add_image_arguments(mode)
    mode.add_argument(
        "--max-queued-s",
        type=float,
        default=GatewayConfig.max_queued_s,
        metavar="SECONDS",
        help="with --burst: the server's --max-queued-seconds, printed beside the latencies",
    )
    add_jobs_arguments(parser)
    add_grpc_arguments(parser)
    kill = parser.add_argument_group("failover (gateway.bench.failover)")
    kill.add_argument(
        "--kill-worker-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="SIGKILL one worker of --gateway-pid this long into the run and time the recovery",
    )
    kill.add_argument("--gateway-pid", type=int, default=None, help="the pid of the `poolgate serve` under test")
    kill.add_argument("--metrics-url", default=None, help="where the gateway serves /metrics (default: URL/metrics)")
    st = parser.add_argument_group("sentence-transformers baseline")
    st.add_argument(
        "--compare-sentence-transformers",
        action="store_true",
        help="also encode the corpus in-process with sentence-transformers",
    )
    st.add_argument("--st-model", default=None, help="model folder (default: the bundled MiniLM)")
    st.add_argument("--st-batch-size", type=_positive_int, default=32)
    st.add_argument("--st-device", default="cpu")
    st.add_argument("--st-dtype", choices=DTYPE_CHOICES[1:], default="float32")
    st.add_argument(
        "--check-cosine",
        action="store_true",
        help="after the run, encode the corpus with sentence-transformers in float32 and report the "
        "worst and mean cosine of every poolgate vector (and of the --st-dtype baseline's) to it",
    )
    add_peer_arguments(parser)


def load_texts(args: argparse.Namespace) -> tuple[list[str], str]:
    if args.latency:
        words = max(args.latency_tokens - 2, 1)
        return fixed_length_corpus(args.num_texts, words, args.seed), f"{words} words per text, seed={args.seed}"
    if args.corpus:
        return read_corpus(args.corpus), args.corpus
    return synthetic_corpus(args.num_texts, args.seed), f"synthetic seed={args.seed}"


def load_config(args: argparse.Namespace, model: str) -> LoadConfig:
    return LoadConfig(
        url=args.url.rstrip("/"),
        model=model,
        api_key=args.api_key,
        batch_size=1 if args.latency else args.batch_size,
        concurrency=1 if args.latency else args.concurrency,
        encoding_format=args.encoding_format,
        warmup=max(args.warmup, 0),
        passes=args.passes,
        duration_s=args.duration,
        timeout_s=args.timeout,
        truncate=args.truncate,
        keep_vectors=getattr(args, "check_cosine", False),
    )


def kill_plan(args: argparse.Namespace) -> KillPlan | None:
    if args.kill_worker_after is None:
        return None
    if args.gateway_pid is None:
        raise ValueError("--kill-worker-after needs --gateway-pid (the pid of the poolgate serve under test)")
    return KillPlan(args.gateway_pid, args.kill_worker_after, args.metrics_url or f"{args.url.rstrip('/')}/metrics")


def mixed_main(args: argparse.Namespace, texts: list[str], corpus: str, models: list[str]) -> int:
    """Several models: each alone, then all at once; the table, then the report as one JSON line."""
    cfgs = per_model(load_config(args, models[0]), models)
    print(f"poolgate bench: {len(texts):,} texts -> {cfgs[0].url} models={','.join(models)}", file=sys.stderr)
    alone, together = asyncio.run(alone_then_together(cfgs, texts))
    report = mixed_report(cfgs, alone, together, corpus=corpus, num_texts=len(texts))
    print(format_mixed(report))
    line = to_json(report)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n", encoding="utf-8")
    return 0 if report["errors"] == 0 else 1


def _emit(report: dict, table: str, args: argparse.Namespace) -> int:
    """The table, then the report as one JSON line (and to ``--json``); the exit code by its errors."""
    print(table)
    line = to_json(report)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n", encoding="utf-8")
    return 0 if report["errors"] == 0 else 1


def gateway_only_main(args: argparse.Namespace) -> int:
    texts, _ = load_texts(args)
    print(f"poolgate bench --gateway-only: {len(texts):,} texts, zero-cost worker", file=sys.stderr)
    try:
        report = run_gateway_only(load_config(args, "null"), texts, args.gateway_processes, args.zero_cost_tokenizer)
    except (OSError, RuntimeError) as exc:
        print(f"poolgate bench: cannot start: {exc}", file=sys.stderr)
        return 2
    return _emit(report, format_gateway_only(report), args)


def tokenizer_only_main(args: argparse.Namespace) -> int:
    texts, _ = load_texts(args)
    report = run_tokenizer_only(texts, args.batch_size, (1, args.tokenizer_threads))
    return _emit(report, format_tokenizer_only(report), args)


def _served_model(args: argparse.Namespace) -> str | None:
    """``--model``, else the first model the server lists; None (said on stderr) when it cannot be asked."""
    try:
        return str((args.model or [asyncio.run(first_model_id(args.url, args.api_key, args.timeout))])[0])
    except (TimeoutError, OSError, BadResponse, aiohttp.ClientError) as exc:
        print(f"poolgate bench: cannot start: {exc}", file=sys.stderr)
        return None


def burst_main(args: argparse.Namespace) -> int:
    texts, _ = load_texts(args)
    if (model := _served_model(args)) is None:
        return 2
    cfg = load_config(args, model)
    print(f"poolgate bench --burst: {args.burst_requests:,} requests at once -> {cfg.url}", file=sys.stderr)
    report = asyncio.run(run_burst(cfg, texts, args.burst_requests, args.max_queued_s))
    return _emit(report, format_burst(report), args)


def jobs_main(args: argparse.Namespace) -> int:
    texts, _ = load_texts(args)
    if (model := _served_model(args)) is None:
        return 2
    cfg = load_config(args, model)
    if args.beside_job is not None:
        print(f"poolgate bench --beside-job: {args.beside_job:,} lines -> {cfg.url}", file=sys.stderr)
        try:
            report = run_beside_job(cfg, texts, args.beside_job, args.duration or 20.0, args.wait_for_job)
        except (RuntimeError, aiohttp.ClientError) as exc:
            print(f"poolgate bench: {exc}", file=sys.stderr)
            return 2
        return _emit(report, format_beside(report), args)
    print(f"poolgate bench --jobs: {len(texts):,} texts -> {cfg.url}", file=sys.stderr)
    report = run_jobs_compare(cfg, texts, inflight=args.job_inflight, model=args.job_model, in_process=args.in_process)
    return _emit(report, format_jobs(report), args)


def images_main(args: argparse.Namespace) -> int:
    """``--images N``: one image per request (``bench.images``); the text bench's table and report."""
    if (model := _served_model(args)) is None:
        return 2
    cfg = replace(load_config(args, model), batch_size=1, truncate=False)
    urls = image_urls(args.images, args.image_size, args.seed)
    print(f"poolgate bench --images: {len(urls):,} images -> {cfg.url} model={model}", file=sys.stderr)
    result = asyncio.run(run_load(cfg, [], image_payloads(urls, cfg)))
    report = summarize(result, cfg, corpus=image_corpus(args), num_texts=len(urls))
    report.update(mode="images", image_size=args.image_size, images_per_s=report["inputs_per_s"])
    return _emit(report, format_table(report) + f"\n  images/s: {report['images_per_s']:,.2f}", args)


def main(args: argparse.Namespace) -> int:
    if args.images is not None:
        return images_main(args)
    if args.grpc is not None:
        if (model := _served_model(args)) is None:
            return 2
        report = grpc_report(args, load_config(args, model), load_texts(args)[0])
        return _emit(report, format_grpc(report), args)
    if args.jobs or args.beside_job is not None:
        return jobs_main(args)
    if args.gateway_only:
        return gateway_only_main(args)
    if args.burst:
        return burst_main(args)
    if args.tokenizer_only:
        return tokenizer_only_main(args)
    try:
        texts, corpus = load_texts(args)
        kill_plan(args)
        models = args.model or [asyncio.run(first_model_id(args.url, args.api_key, args.timeout))]
        if len(models) > 1 and (
            args.kill_worker_after is not None or args.compare_sentence_transformers or args.compare_peers
        ):
            raise ValueError(
                "several --model runs take neither --kill-worker-after nor a sentence-transformers baseline or peers"
            )
    except (TimeoutError, OSError, ValueError, BadResponse, aiohttp.ClientError) as exc:
        print(f"poolgate bench: cannot start: {exc}", file=sys.stderr)
        return 2
    if len(models) > 1:
        return mixed_main(args, texts, corpus, models)
    model = models[0]
    cfg = load_config(args, model)
    print(f"poolgate bench: {len(texts):,} texts -> {cfg.url} model={model}", file=sys.stderr)
    plan = kill_plan(args)
    if plan is None:
        result, failover = asyncio.run(run_load(cfg, texts)), None
    else:
        result, failover = asyncio.run(run_with_kill(run_load(cfg, texts), plan))
    report = summarize(result, cfg, corpus=corpus, num_texts=len(texts))
    report["mode"] = "latency" if args.latency else "throughput"
    if failover is not None:
        report["failover"] = failover
    st_vectors: list = []
    fp32 = Fp32(args, texts)
    if args.compare_sentence_transformers:
        print("poolgate bench: running the sentence-transformers baseline", file=sys.stderr)
        report = add_reference(report, reference(args, texts, st_vectors))
        fp32.baseline(st_vectors)
    if args.check_cosine:
        print("poolgate bench: encoding the corpus in float32 for --check-cosine", file=sys.stderr)
        report["cosine_to_fp32"] = check_cosine(args, cfg, texts, result, st_vectors, fp32)
    if args.compare_peers:
        print(f"poolgate bench: running the CPU peers {','.join(args.compare_peers)}", file=sys.stderr)
        report = run_peers(args, texts, report, fp32)
    table = format_table(report) + (f"\n{format_failover(failover)}" if failover is not None else "")
    table += f"\n{format_peers(report)}" if args.compare_peers else ""
    code = _emit(report, table, args)
    cos = report.get("cosine_to_fp32")
    return 1 if cos is not None and ("error" in cos or cos["poolgate_below_0.999"] > 0) else code
