"""The whole agent loop on a real GPU: `gpu-agent run --source nvml` against a local API stand-in.

Run from the repository root on a GPU machine (part of tests/gpu/gpu_check.sh):

    python tests/gpu/live_loop.py [seconds]

It starts the Kubernetes API stand-in with one Node, runs the real daemon as a subprocess (real
NVML, real kubernetes client, fast demo intervals), stops it with SIGTERM, and prints the daemon's
peak RSS and what reached the server: the writes, their spacing, the Node's final annotations and
the daemon's exit code.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from gpu_contract.schema import DEFAULT_PREFIX
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node

NODE = "gpu-node-live"


def _status_field(pid: int, field: str) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    except OSError as error:
        return f"unreadable ({error})"
    return "absent"


def main() -> int:
    duration_s = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    with ApiServerStandIn() as server, tempfile.TemporaryDirectory() as scratch:
        server.put_node(gpu_node(NODE, gpu_count=1, product="NVIDIA-H200"))
        kubeconfig = server.write_kubeconfig(Path(scratch) / "kubeconfig")
        argv = [
            sys.executable, "-m", "agent", "run", "--source", "nvml", "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--sample-interval-s", "1",
            "--min-write-interval-s", "2", "--heartbeat-s", "6", "--metrics-port", "0",
        ]  # fmt: skip
        daemon = subprocess.Popen(argv)
        time.sleep(duration_s)
        # The daemon's peak memory with the real NVML source (libnvidia-ml mapped, NVML open).
        print("daemon peak RSS (VmHWM):", _status_field(daemon.pid, "VmHWM"))
        daemon.send_signal(signal.SIGTERM)
        exit_code = daemon.wait(timeout=30)
        patches = [r for r in server.requests if r.method == "PATCH" and r.status == 200]
        times = [
            datetime.fromisoformat(
                r.json()["metadata"]["annotations"][DEFAULT_PREFIX + "updated-at"][:-1] + "+00:00"
            )
            for r in patches
        ]
        gaps_s = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        annotations = server.node(NODE)["metadata"].get("annotations", {})
        ours = {k: v for k, v in sorted(annotations.items()) if k.startswith(DEFAULT_PREFIX)}
        print(json.dumps({"writes": len(patches), "gaps_between_writes_s": gaps_s}, indent=1))
        print(json.dumps(ours, indent=1))
        print("daemon exit code:", exit_code)
        return 0 if exit_code == 0 and patches else 1


if __name__ == "__main__":
    sys.exit(main())
