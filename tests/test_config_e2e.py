"""`poolgate serve --config FILE` as a real process: two models (remote fake workers, with the worker token),
listed with their backends, served by name, shown by the admin API; a bad file exits 2 naming file, line and key;
a --port flag beside the file wins."""
import json
import signal
import subprocess
import sys
import urllib.request

from tests.processes import free_port, health_status, wait_healthy

KEY = "sk-e2e"


def _get(url: str, key: str | None = KEY) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _embed(url: str, model: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/embeddings", data=json.dumps({"model": model, "input": ["a b c"]}).encode(),
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_two_models_from_a_config_file(tmp_path):
    (tmp_path / "token").write_text("e2e-token\n")
    ports = {"alpha": free_port(), "beta": free_port()}
    workers = [subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "worker", "--served-model-name", name,
                                 "--listen", f"tcp://127.0.0.1:{port}", "--token-file", str(tmp_path / "token"),
                                 "--runner-factory", "tests.workers.fake_factory:build"], stderr=subprocess.DEVNULL)
               for name, port in ports.items()]
    http = free_port()
    models = "".join(f'[[models]]\nname = "{n}"\n[[models.remote]]\nurl = "tcp://127.0.0.1:{p}"\n\n'
                     for n, p in ports.items())
    (tmp_path / "serve.toml").write_text(f'port = {http}\napi_key = "{KEY}"\nworker_token_file = "token"\n\n{models}')
    gateway = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--config",
                                str(tmp_path / "serve.toml")], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{http}"
    try:
        wait_healthy(url, 60, gateway)
        listed = _get(f"{url}/v1/models")["data"]
        assert [(m["id"], m["backends"]) for m in listed] == [("alpha", ["cpu"]), ("beta", ["cpu"])]
        assert len(_embed(url, "alpha")["data"][0]["embedding"]) == 8
        assert _embed(url, "beta")["model"] == "beta"
        pools = _get(f"{url}/admin/pools")["data"]
        assert [(m["id"], [w["address"] for p in m["pools"] for w in p["workers"]]) for m in pools] == [
            (name, [f"tcp://127.0.0.1:{port}"]) for name, port in ports.items()]
    finally:
        gateway.send_signal(signal.SIGTERM)
        code = gateway.wait(timeout=30)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    assert code == 0


def test_a_bad_config_file_exits_2_naming_file_line_and_key(tmp_path):
    (tmp_path / "bad.toml").write_text('port = 8000\n\n[[models]]\nname = "x"\nreplicas = "two"\n')
    out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--config", str(tmp_path / "bad.toml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"{tmp_path / 'bad.toml'}:5: models[0].replicas: must be an integer, got 'two'" in out.stderr


def test_a_port_flag_beside_the_config_file_wins(tmp_path):
    """``poolgate serve --config F --port P`` serves on P, not on the file's port (a Kubernetes pod's port)."""
    worker_port, file_port, flag_port = free_port(), free_port(), free_port()
    worker = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "worker", "--served-model-name", "alpha",
                               "--listen", f"tcp://127.0.0.1:{worker_port}",
                               "--runner-factory", "tests.workers.fake_factory:build"], stderr=subprocess.DEVNULL)
    (tmp_path / "serve.toml").write_text(f'port = {file_port}\napi_key = "{KEY}"\n\n[[models]]\nname = "alpha"\n'
                                         f'[[models.remote]]\nurl = "tcp://127.0.0.1:{worker_port}"\n')
    gateway = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--config",
                                str(tmp_path / "serve.toml"), "--port", str(flag_port)], stderr=subprocess.PIPE,
                               text=True)
    url = f"http://127.0.0.1:{flag_port}"
    try:
        wait_healthy(url, 60, gateway)
        assert len(_embed(url, "alpha")["data"][0]["embedding"]) == 8  # the file's api_key still holds
        assert health_status(f"http://127.0.0.1:{file_port}") is None  # nothing on the file's port
    finally:
        gateway.send_signal(signal.SIGTERM)
        code = gateway.wait(timeout=30)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert code == 0
