"""Telemetry names in one place: Prometheus metric and label names, buckets, the span and its attributes.

Metric names follow Prometheus conventions: the single-word prefix
``poolgate_``, base units as suffixes (``_seconds``), counters exposed with
``_total``; no colons (reserved for recording rules). Latency buckets are the
OpenTelemetry GenAI ×2 series extended down to 1 ms, so they compare with
``gen_ai.server.request.duration``. The span is vLLM's: one ``llm_request``
(kind SERVER) per request, with vLLM's ``gen_ai.*`` latency attributes plus
the GenAI semantic conventions for embeddings, and poolgate's own attributes
under ``poolgate.`` (the request's lane, its inputs' modalities and media count).
"""

from __future__ import annotations

PREFIX = "poolgate"

# --- labels -------------------------------------------------------------------
MODEL = "model"
TASK = "task"
ROUTE = "route"
PROTOCOL = "protocol"  # "http" or "grpc" (the request series)
STATUS = "status"  # an HTTP status; on poolgate_batch_jobs a batch's (validating, in_progress, ...)
BACKEND = "backend"
WORKER = "worker"
REASON = "reason"
TENANT = "tenant"  # a tenant's name from the API keys file, never its key
LANE = "lane"  # a job's lane: live | bulk (shared.domain.lanes)
ERROR_TYPE = "error_type"
OUTCOME = "outcome"  # a batch line's: completed | failed
BATCH_ID = "batch_id"  # a Batch API batch's id (only while it runs: its series go when it ends)
KIND = "kind"  # a media item's: image | audio (shared.wire.media)

# --- gateway-side metrics (recorded per HTTP request) --------------------------
REQUESTS = f"{PREFIX}_requests"  # counter {route, model, status, protocol}; exposed as ..._total
REQUEST_DURATION = f"{PREFIX}_request_duration_seconds"  # histogram {route, model, protocol}
REQUEST_ERRORS = f"{PREFIX}_request_errors"  # counter {route, model, error_type}
PROMPT_TOKENS = f"{PREFIX}_prompt_tokens"  # counter {model, task}
REQUEST_PROMPT_TOKENS = f"{PREFIX}_request_prompt_tokens"  # histogram {model, task}
QUEUE_TIME = f"{PREFIX}_request_queue_time_seconds"  # histogram {model, task, backend}
INFERENCE_TIME = f"{PREFIX}_request_inference_time_seconds"  # histogram {model, task, backend}
REQUESTS_IN_FLIGHT = f"{PREFIX}_requests_in_flight"  # gauge {model}
ADMISSION_REJECTIONS = f"{PREFIX}_admission_rejections"  # counter {model, reason}
TENANT_REQUESTS = f"{PREFIX}_tenant_requests"  # counter {tenant, model, status}
TENANT_PROMPT_TOKENS = f"{PREFIX}_tenant_prompt_tokens"  # counter {tenant, model}
MEDIA_ITEMS = f"{PREFIX}_media_items"  # counter {model, kind}: images and audio clips in requests

# --- gateway-side pool series (each pool's admission, published before each scrape) ---
# The autoscaling signals (gateway.telemetry.pool_series); a pool is a model's pool of one backend.
POOL_QUEUED_TOKENS = f"{PREFIX}_pool_queued_tokens"  # gauge {model, backend, lane}: admitted, not yet answered
POOL_QUEUED_SECONDS = f"{PREFIX}_pool_queued_seconds"  # gauge {model, backend, lane}: seconds behind (tokens/capacity)
POOL_CAPACITY = f"{PREFIX}_pool_capacity_tokens_per_second"  # gauge {model, backend}: ready workers' measured sum
POOL_ADMITTED = f"{PREFIX}_pool_admitted_jobs"  # counter {model, backend, lane}
POOL_ADMITTED_TOKENS = f"{PREFIX}_pool_admitted_tokens"  # counter {model, backend, lane}
POOL_REFUSED = f"{PREFIX}_pool_refused_jobs"  # counter {model, backend, reason, lane}

# --- the Batch API (gateway.jobs) ------------------------------------------------
BATCH_JOBS = f"{PREFIX}_batch_jobs"  # gauge {status}: batches in the store by status (read at each scrape)
BATCH_JOB_LINES = f"{PREFIX}_batch_job_lines"  # counter {tenant, outcome}: batch lines finished
BATCH_JOB_TOKENS = f"{PREFIX}_batch_job_tokens"  # counter {tenant}: input tokens of completed batch lines
BATCH_JOB_PROGRESS = f"{PREFIX}_batch_job_progress_ratio"  # gauge {batch_id, tenant}: lines finished / lines, running

# --- worker-side metrics (pulled from every worker at scrape time) -------------
WORKER_UP = f"{PREFIX}_worker_up"  # gauge {model, backend, worker}
WORKER_RECOVERIES = f"{PREFIX}_worker_recoveries"  # counter {model, backend, worker}
REQUESTS_RUNNING = f"{PREFIX}_requests_running"  # gauge: calls with a batch started {model, backend, worker}
REQUESTS_WAITING = f"{PREFIX}_requests_waiting"  # gauge: calls queued, no batch started {model, backend, worker}
SEQUENCES_RUNNING = f"{PREFIX}_sequences_running"  # gauge {model, backend, worker}
SEQUENCES_WAITING = f"{PREFIX}_sequences_waiting"  # gauge {model, backend, worker}
TOKENS_WAITING = f"{PREFIX}_tokens_waiting"  # gauge {model, backend, worker}
BATCH_SIZE = f"{PREFIX}_batch_size"  # histogram (sequences per batch) {model, backend, worker}
BATCH_TOKENS = f"{PREFIX}_batch_tokens"  # histogram (tokens per batch) {model, backend, worker}
BATCH_FILL = f"{PREFIX}_batch_fill_ratio"  # histogram (batch tokens / token budget) {model, backend, worker}
DEVICE_MEMORY = f"{PREFIX}_device_memory_bytes"  # gauge {model, backend, worker, kind=allocated|reserved}
DEVICE_OUT_OF_MEMORY = f"{PREFIX}_device_out_of_memory"  # counter: batches split after OOM {model, backend, worker}
WORKER_TOKENS_PER_S = f"{PREFIX}_worker_tokens_per_second"  # gauge: measured capacity {model, backend, worker}
EMBEDDING_CACHE_HITS = f"{PREFIX}_embedding_cache_hits"  # counter: sequences served from cache {model, backend, worker}
EMBEDDING_CACHE_MISSES = f"{PREFIX}_embedding_cache_misses"  # counter: sequences the model ran {model, backend, worker}
EMBEDDING_CACHE_BYTES = f"{PREFIX}_embedding_cache_bytes"  # gauge {model, backend, worker}
# the prefix cache (causal decoders): hit rate = hit / looked up; tokens saved = hit + shared
PREFIX_CACHE_LOOKED_UP = f"{PREFIX}_prefix_cache_looked_up_tokens"  # counter: tokens of eligible sequences {model, ...}
PREFIX_CACHE_HITS = f"{PREFIX}_prefix_cache_hit_tokens"  # counter: tokens whose K/V came from the cache {model, ...}
PREFIX_CACHE_SHARED = f"{PREFIX}_prefix_cache_shared_tokens"  # counter: tokens computed once for a batch {model, ...}
PREFIX_CACHE_BYTES = f"{PREFIX}_prefix_cache_bytes"  # gauge: K/V bytes held {model, backend, worker}

# --- buckets --------------------------------------------------------------------
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
TOKEN_BUCKETS = tuple(2**k for k in range(21))  # 1 .. 1M tokens
BATCH_SIZE_BUCKETS = tuple(2**k for k in range(13))  # 1 .. 4096 sequences
FILL_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

# --- the span ---------------------------------------------------------------------
SPAN_NAME = "llm_request"
# vLLM's attributes (vllm/tracing SpanAttributes)
ATTR_REQUEST_ID = "gen_ai.request.id"
ATTR_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_TIME_IN_INFERENCE = "gen_ai.latency.time_in_model_inference"
# GenAI semantic conventions
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_MODEL = "gen_ai.request.model"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_RESPONSE_ID = "gen_ai.response.id"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_ENCODING_FORMATS = "gen_ai.request.encoding_formats"
ATTR_DIMENSION_COUNT = "gen_ai.embeddings.dimension.count"
ATTR_ERROR_TYPE = "error.type"
ATTR_HTTP_ROUTE = "http.route"
ATTR_HTTP_STATUS = "http.response.status_code"
# a gRPC call's span (OpenTelemetry's RPC conventions) instead of the http.* attributes
ATTR_RPC_SYSTEM = "rpc.system"
ATTR_RPC_SERVICE = "rpc.service"
ATTR_RPC_METHOD = "rpc.method"
ATTR_RPC_GRPC_STATUS = "rpc.grpc.status_code"
# poolgate's own (its prefix, as OpenTelemetry asks of attributes outside the conventions)
ATTR_LANE = "poolgate.lane"  # "live" or "bulk" (shared.domain.lanes)
ATTR_MODALITIES = "poolgate.input.modalities"  # what the inputs hold: "text", "image", "text,image", "audio", ...
ATTR_MEDIA_COUNT = "poolgate.input.media_count"  # images and audio clips in the request
PROVIDER = "poolgate"

# gen_ai.operation.name per pooling task (custom values where GenAI has none)
OPERATIONS: dict[str, str] = {
    "embed": "embeddings",
    "token_embed": "embeddings",
    "classify": "classify",
    "token_classify": "pooling",
    "score": "score",
    "rerank": "rerank",
}

# detailed child spans (--collect-detailed-traces), created in the worker
CHILD_SPANS = ("tokenize", "queue", "forward", "pool")
