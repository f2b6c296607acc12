"""SIGTERM drains a real `poolgate serve` (bundled model): not ready, new requests 503, the call in flight
finishes, then a clean exit with no worker left."""
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from tests.processes import alive, children, free_port, health_status, wait_healthy


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_sigterm_drains_then_exits():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # float32: the call in flight must outlast the checks below however fast the bf16 CPU kernels get; a
    # drain timeout far past that call's time on a slow CPU (the default 30 s is less than 188k tokens take)
    proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(port),
                             "--dtype", "float32", "--drain-timeout", "120"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, 180, proc)
        workers = children(proc.pid)
        big: list = []
        texts = [f"word{i} " * 60 for i in range(256)]  # ~47k tokens: ~10 s in float32 on the CI's 2 cores
        thread = threading.Thread(target=lambda: big.append(post(url, {"input": texts})))
        thread.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert health_status(url) == 503
        status, headers = post(url, {"input": "late"}, timeout=10)
        assert status == 503 and headers.get("Retry-After") == "1"
        thread.join(150)
        assert big and big[0][0] == 200  # the call in flight when SIGTERM came finished
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert "SIGTERM: draining" in err and "drained: no call in flight" in err
    time.sleep(0.5)
    assert workers and not [p for p in workers if alive(p)]
