"""Workers on two "hosts" (network namespaces), the gateway on a third, real TCP with the token between them:
traffic keeps flowing, with no failed request, while one worker is killed (SIGKILL) and started again."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--mount"]


def _namespaces_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare (util-linux) and ip (iproute2)"
    probe = subprocess.run([*UNSHARE, "sh", "-c", "mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns && "
                            "ip netns add probe && ip link add pgprobe0 type veth peer name pgprobe1"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this sandbox may not create user + network namespaces: {probe.stderr.strip()[:200]}"
    return None


@pytest.mark.skipif((reason := _namespaces_unavailable()) is not None, reason=reason or "")
def test_traffic_flows_through_a_worker_killed_and_restarted_on_another_host():
    out = subprocess.run([*UNSHARE, sys.executable, "-m", "tests.multihost", "setup", "--seconds", "6"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] > 100 and result["failed"] == 0, result
    assert result["whole_after_restart_s"] is not None and result["final_states"] == ["ready", "ready"], result
    assert result["recoveries"]["tcp://10.77.1.2:9100"] >= 1, result  # the killed worker went down and came back
