"""`poolgate serve` as a real process on the bundled model, driven by the official openai SDK."""
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import openai
import pytest

from poolgate.shared.config.models import DEFAULT_MODEL_NAME, bundled_model_path
from tests.processes import alive, children, free_port, wait_healthy

TEXTS = ["a", "!", "Hello, world.", "The quick brown fox jumps over the lazy dog.",
         "Embeddings map text to vectors; similar meanings land close together. " * 3]
LONG = " ".join(f"token{i}" for i in range(300))


@pytest.fixture(scope="module")
def server_factory():
    started = []

    def start(*flags: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(port), *flags],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        wait_healthy(f"http://127.0.0.1:{port}", 180, proc)
        return f"http://127.0.0.1:{port}"

    yield start
    outcomes = []
    for proc in started:
        workers = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        outcomes.append((workers, proc.wait(timeout=30)))
    time.sleep(0.5)
    for workers, code in outcomes:
        assert workers, "no worker process found"
        assert code == 0
        assert not [p for p in workers if alive(p)], "worker left behind"


@pytest.fixture(scope="module")
def fp32_url(server_factory):
    return server_factory("--dtype", "float32")


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_model_path()), device="cpu")


def _client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


def _cosines(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def test_sdk_default_base64_matches_sentence_transformers(fp32_url, st_model):
    resp = _client(fp32_url).embeddings.create(model=DEFAULT_MODEL_NAME, input=TEXTS)
    got = [d.embedding for d in sorted(resp.data, key=lambda d: d.index)]
    assert min(_cosines(got, st_model.encode(TEXTS))) >= 0.9999
    n_tokens = sum(len(ids) for ids in st_model.tokenizer(TEXTS)["input_ids"])
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == n_tokens


def test_sdk_float_and_token_ids(fp32_url, st_model):
    client = _client(fp32_url)
    floats = client.embeddings.create(model=DEFAULT_MODEL_NAME, input=TEXTS[2], encoding_format="float")
    ids = st_model.tokenizer(TEXTS[2])["input_ids"]
    by_ids = client.embeddings.create(model=DEFAULT_MODEL_NAME, input=[ids])
    want = st_model.encode([TEXTS[2]])
    assert _cosines([floats.data[0].embedding], want)[0] >= 0.9999
    assert _cosines([by_ids.data[0].embedding], want)[0] >= 0.9999


def test_too_long_is_rejected_then_truncated_on_request(fp32_url, st_model):
    client = _client(fp32_url)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens"):
        client.embeddings.create(model=DEFAULT_MODEL_NAME, input=LONG)
    resp = client.embeddings.create(model=DEFAULT_MODEL_NAME, input=LONG, extra_body={"truncate_prompt_tokens": -1})
    assert resp.usage.prompt_tokens == 256
    assert _cosines([resp.data[0].embedding], st_model.encode([LONG]))[0] >= 0.9999


def test_errors_through_the_sdk(fp32_url):
    client = _client(fp32_url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.embeddings.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError, match="at least one prompt"):
        client.embeddings.create(model=DEFAULT_MODEL_NAME, input=[])
    with pytest.raises(openai.BadRequestError, match="does not support Matryoshka"):
        client.embeddings.create(model=DEFAULT_MODEL_NAME, input="hi", dimensions=64)
    with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
        client.embeddings.create(model=DEFAULT_MODEL_NAME, input=[[101, 999999, 102]])
    assert [m.id for m in client.models.list()] == [DEFAULT_MODEL_NAME]
    assert len(client.embeddings.create(model=DEFAULT_MODEL_NAME, input=[[101, 102]]).data) == 1


def test_auto_truncate_flag_in_bf16_over_tcp_transport(server_factory, st_model):
    url = server_factory("--auto-truncate", "--transport", "tcp", "--dtype", "bfloat16")
    resp = _client(url).embeddings.create(model=DEFAULT_MODEL_NAME, input=[LONG, "short"])
    assert resp.usage.prompt_tokens == 256 + len(st_model.tokenizer("short")["input_ids"])
    got = [d.embedding for d in resp.data]
    assert min(_cosines(got, st_model.encode([LONG, "short"]))) >= 0.999  # bf16 on any CPU


def test_bad_model_folder_exits_cleanly(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    missing = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "serve", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    broken = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "serve", str(tmp_path), "--port", str(free_port())],
                            capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1 and "could not start: worker process exited" in broken.stderr


def _start_fake_worker(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "worker", "--served-model-name", "remote-fake",
                             "--listen", f"tcp://127.0.0.1:{port}", "--runner-factory", "tests.workers.fake_factory:build"])


def test_gateway_uses_a_remote_worker_over_tcp_and_recovers_it():
    """A worker started on its own (as on another host), given to the gateway by URL;
    the gateway waits for it, and takes it back after it restarts."""
    worker_port, gateway_port = free_port(), free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(gateway_port),
                                "--worker-url", f"tcp://127.0.0.1:{worker_port}"], stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # the gateway comes up first and waits for the worker
    worker = _start_fake_worker(worker_port)
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_healthy(url)
        resp = _client(url).embeddings.create(model="remote-fake", input=["one two three"])
        assert len(resp.data[0].embedding) == 8 and resp.usage.prompt_tokens == 5
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        with pytest.raises(openai.APIStatusError) as err:
            _client(url).embeddings.create(model="remote-fake", input=["down"])
        assert err.value.status_code == 503
        worker = _start_fake_worker(worker_port)
        wait_healthy(url)
        assert _client(url).embeddings.create(model="remote-fake", input=["back"]).usage.prompt_tokens == 3
    finally:  # both processes are stopped whatever failed, before any check of how they ended
        gateway.send_signal(signal.SIGTERM)
        gateway_rc = _wait_or_kill(gateway)
        worker_outlived = worker.poll() is None  # a remote worker outlives the gateway that used it
        worker.send_signal(signal.SIGTERM)
        worker_rc = _wait_or_kill(worker)
    assert gateway_rc == 0 and worker_outlived and worker_rc == 0


def _wait_or_kill(proc: subprocess.Popen) -> int | None:
    """``proc``'s exit code within 30 s, else it is killed and None."""
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_port_in_use_exits_with_a_message():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "could not start" in out.stderr


def test_metrics_on_their_own_port_cover_the_real_worker(server_factory):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    metrics_port = free_port()
    url = server_factory("--metrics-port", str(metrics_port), "--dtype", "float32")
    _client(url).embeddings.create(model=DEFAULT_MODEL_NAME, input=["hello world", "metrics"])
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{url}/metrics")
    assert err.value.code == 404  # only on the metrics port
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    got = {(s.name, s.labels.get("status")): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}
    assert got[("poolgate_requests_total", "200")] == 1
    assert got[("poolgate_worker_up", None)] == 1
    assert got[("poolgate_batch_size_sum", None)] == 2  # the warm-up is not counted
