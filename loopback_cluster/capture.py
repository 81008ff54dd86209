"""Record what a real kube-scheduler and kube-apiserver put on the wire, as test fixtures.

The golden and contract tests read real bytes (`tests/fixtures/kube-*-v<minor>`), so a new
Kubernetes minor needs them recorded again from that minor's control plane:

- **kube-scheduler**: a recording extender on loopback answers a real kube-scheduler in both
  modes (`nodeCacheCapable` false and true) for the README's layout (four 8-GPU Nodes whose
  utilization annotation is 0.10, 0.60, 0.95 and 0.30, `updated-at` fixed at 13:59:50 on
  2026-11-30, the golden tests' clock; one pod asking one GPU): the filter
  refuses utilization above 0.90 and the prioritize scores `(1 - utilization) x 10`. Each
  exchange is written as `NNNN-<verb>.request.json` (the body's bytes as sent),
  `.response.json` and `.meta.json`, with the configurations under `config/`. After that pod,
  each mode's `SCENARIOS` (every node rejected, then bound after an annotation change; a
  `NodeNames` reply in full-node mode; an `Error` reply; a reply naming an unknown node;
  `FailedAndUnresolvableNodes`) each schedule a pod of their own: their exchanges are tagged
  with the scenario in `.meta.json`, their FailedScheduling messages are in `events.json`.
- **kube-apiserver**: the requests of the earlier minor's Node exchanges that need no set-up of
  their own (create, status, merge, strategic and JSON patches, apply with and without force,
  every error answer but the service-account ones, resourceVersion preconditions, create, list
  and a paged list) are sent again, in the same order, to the new minor's server; the request
  and the whole response (status line, headers as received, body) are written in the same
  format, under the same names. `--apiserver-out` or `--scheduler-out` alone records one side.
  The rest (watches, compaction, an API server restart, service-account tokens) need set-ups
  of their own: `python -m loopback_cluster.capture_watch` records them.

    LOOPBACK_KUBERNETES=v1.37 python -m loopback_cluster.capture \\
        --from tests/fixtures/kube-apiserver-v1.36 \\
        --scheduler-out tests/fixtures/kube-scheduler-v1.37 \\
        --apiserver-out tests/fixtures/kube-apiserver-v1.37
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import http.server
import json
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from loopback_cluster.control_plane import (
    BuildSpec,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
    free_port,
    running_control_plane,
)
from loopback_cluster.workload import pod_events

SCHEDULER_NAME: Final = "gpu-scheduler"
UTILIZATION_KEY: Final = "gpu-scheduler.example.com/utilization"
UPDATED_AT_KEY: Final = "gpu-scheduler.example.com/updated-at"
# The set-up's sample time, fixed so that the golden tests judge the data fresh at their clock.
UPDATED_AT: Final = "2026-11-30T13:59:50Z"
LAYOUT: Final = {"node-cool": 0.10, "node-warm": 0.60, "node-hot": 0.95, "node-t4": 0.30}
LIMIT: Final = 0.90
# The earlier minor's exchanges replayed, in the order they were taken there (the apply patches
# came after the LIST): each needs only what the ones before made. Not replayed: the watches,
# compaction and restart cases, the service-account tokens and anonymous auth turned off,
# which need a set-up of their own (`loopback_cluster.capture_watch` records them).
REPLAYED: Final = (
    "01-create-node.json",
    "02-patch-node-status.json",
    "10-merge-patch-annotations.json",
    "11-merge-patch-change-and-remove.json",
    "12-merge-patch-noop.json",
    "20-strategic-merge-patch.json",
    "21-json-patch.json",
    "22-json-patch-remove-missing.json",
    "23-json-patch-unescaped-slash.json",
    "24-json-patch-test-fails.json",
    "30-err-404-node-not-found.json",
    "31-err-422-invalid-annotation-key.json",
    "32-err-422-annotations-too-large.json",
    "33-err-415-unsupported-content-type.json",
    "34-err-400-malformed-json-merge-patch.json",
    "35-err-400-malformed-json-patch.json",
    "36-err-annotation-value-not-string.json",
    "37-err-json-patch-as-merge-body.json",
    "38-err-apply-patch-no-fieldmanager.json",
    "40-err-403-anonymous-no-credentials.json",
    "41-err-401-invalid-bearer-token.json",
    "44-err-409-stale-resourceversion.json",
    "45-merge-patch-current-resourceversion.json",
    "50-list-nodes.json",
    "25-apply-patch-conflict.json",
    "26-apply-patch-force.json",
    "55-create-node-2.json",
    "60-create-node-3.json",
    "61-list-nodes-limit1.json",
)
# Sent without the admin client certificate: anonymous (`40`) or with a bearer token the
# server never issued (`41`, the earlier capture's token is redacted, so any invalid one does).
ANONYMOUS: Final = frozenset({"40-err-403-anonymous-no-credentials.json"})
INVALID_TOKEN: Final = "Bearer not-a-token-this-server-issued"
# Request bodies the earlier capture described instead of saving (`body_description`); sent as
# described, and again described rather than saved.
UNSAVED_BODIES: Final = {
    "32-err-422-annotations-too-large.json": json.dumps(
        {"metadata": {"annotations": {"gpu-scheduler.example.com/blob": "x" * 262144}}},
        separators=(",", ":"),
    ),
}
# Carry a resourceVersion: the earlier capture's number means nothing here, so the Node's
# current one (`45`) or the one before it (`44`, stale) is put in its place.
RESOURCE_VERSION_OFFSET: Final = {
    "44-err-409-stale-resourceversion.json": -1,
    "45-merge-patch-current-resourceversion.json": 0,
}
USER_AGENT: Final = "gpu-scheduler-fixture-capture/0.2 (python http.client)"


# ----------------------------------------------------------------------------- the extender


class _Recorder(http.server.ThreadingHTTPServer):
    """The recording extender: the layout's rules, each exchange kept in arrival order."""

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.exchanges: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        # How filter answers (`_SCENARIOS`): "layout" (the README's rules) unless a scenario
        # asks for a reply the scheduler must cope with.
        self.reply = "layout"
        self.scenario = "first-pod"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Recorder

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        args = json.loads(raw)
        verb = self.path.strip("/")
        names = args.get("NodeNames")
        items = (args.get("Nodes") or {}).get("items") or []
        sent = names if names is not None else [n["metadata"]["name"] for n in items]
        reply: Any
        mode = self.server.reply
        utilization = {n: _utilization(n, items) for n in sent}
        limit = -1.0 if mode in ("reject-all", "unresolvable") else LIMIT
        passed: list[str] = [n for n in sent if utilization[n] <= limit]
        if verb == "filter":
            failed = {n: f"gpu utilization above {LIMIT:.2f}" for n in sent if n not in passed}
            if mode == "error":
                reply = {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "Error": "boom"}
            elif mode == "unresolvable":
                reply = {"NodeNames": [], "FailedAndUnresolvableNodes": failed, "Error": ""}
            elif mode == "unknown-node":
                reply = {"NodeNames": [*passed, "node-nowhere"], "FailedNodes": {}, "Error": ""}
            elif names is not None or mode == "names-reply":
                reply = {"NodeNames": passed, "FailedNodes": failed, "Error": ""}
            else:
                kept = [n for n in items if n["metadata"]["name"] in passed]
                reply = {"Nodes": {"items": kept}, "FailedNodes": failed, "Error": ""}
        else:
            reply = [{"Host": n, "Score": round((1 - utilization[n]) * 10)} for n in sent]
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        now = time.time()
        pod = args.get("Pod") or {}
        meta = {
            "method": "POST",
            "path": self.path,
            "headers": dict(self.headers.items()),
            "received_unix": now,
            "status": 200,
            "verb": verb,
            "pod": f"{pod['metadata']['namespace']}/{pod['metadata']['name']}",
            "sent_form": "NodeNames" if names is not None else "Nodes",
            "nodes": sorted(sent),
            "passed": sorted(passed) if verb == "filter" else None,
            "scenario": self.server.scenario,
            "reply": mode,
        }
        with self.server.lock:
            self.server.exchanges.append({"request": raw, "response": body, "meta": meta})

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the exchanges are the record
        pass


def _utilization(name: str, items: Sequence[dict[str, Any]]) -> float:
    """The node's utilization annotation as sent (full-node), else as the layout and the
    scenarios' annotation change left it (names only: the request has names alone)."""
    for item in items:
        if item["metadata"]["name"] == name:
            return float(item["metadata"]["annotations"].get(UTILIZATION_KEY, "0"))
    return _CURRENT.get(name, LAYOUT.get(name, 0.0))


# The layout as the scenarios changed it (`annotation-change`).
_CURRENT: dict[str, float] = {}


def _register(api: KubeApi, name: str, utilization: float) -> None:
    """A Ready 8-GPU Node with the agent's utilization annotation, the taint lifted."""
    api.create(
        "/api/v1/nodes?fieldManager=fixture-setup",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.count": "8"},
                "annotations": {UTILIZATION_KEY: f"{utilization:.2f}", UPDATED_AT_KEY: UPDATED_AT},
            },
        },
    )
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
    api.raw(
        "PATCH",
        f"/api/v1/nodes/{name}/status?fieldManager=fixture-kubelet",
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        content_type="application/merge-patch+json",
    )
    api.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


def _pod(name: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "gpu-test"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "pause:3.10",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi", **gpu},
                        "limits": {"memory": "64Mi", **gpu},
                    },
                }
            ],
        },
    }


def capture_scheduler(plane: ControlPlane, out: Path, *, timeout_s: float = 60.0) -> None:
    """One pod scheduled per mode, every extender exchange written under `out/<mode>/`."""
    with plane.admin() as api:
        for name, utilization in LAYOUT.items():
            _register(api, name, utilization)
        for names_only in (False, True):
            mode = f"nodecache-{str(names_only).lower()}"
            recorder = _Recorder(free_port())
            serving = threading.Thread(target=recorder.serve_forever, daemon=True)
            serving.start()
            url = f"http://127.0.0.1:{recorder.server_address[1]}"
            config = SchedulerConfig(SCHEDULER_NAME, ExtenderConfig(url, names_only, False))
            plane.start_scheduler(config, name=f"capture-{mode}")
            prefix = f"gpu-pod-{'c' if names_only else 'f'}"
            pods = [f"{prefix}1"]
            events: list[dict[str, Any]] = []
            try:
                first = pods[0]
                api.create("/api/v1/namespaces/default/pods", _pod(first))
                _wait(f"{first} to be bound", partial(_bound, api, first), timeout_s)
                for scenario in SCENARIOS[names_only]:
                    events.append(
                        _run_scenario(
                            api, recorder, scenario, pods, prefix=prefix, timeout_s=timeout_s
                        )
                    )
            finally:
                plane.stop_scheduler(f"capture-{mode}")
                recorder.shutdown()
            for pod in pods:
                api.delete(f"/api/v1/namespaces/default/pods/{pod}?gracePeriodSeconds=0")
            _write_exchanges(out / mode, recorder.exchanges)
            (out / mode / "events.json").write_text(json.dumps(events, indent=1) + "\n")
            document = config.document(Path("/etc/kubernetes/scheduler.kubeconfig"))
            name = "sched-extender-nodecache.json" if names_only else "sched-extender.json"
            (out / "config").mkdir(parents=True, exist_ok=True)
            (out / "config" / name).write_text(json.dumps(document, indent=1) + "\n")
        for name in LAYOUT:
            api.delete(f"/api/v1/nodes/{name}")


# After the first pod, the cases whose replies the scheduler must cope with, per mode
# (`nodeCacheCapable`), in this order: each pod's extender calls and FailedScheduling events
# are recorded. `annotation-change` lets the pod `reject-all` left pending bind.
SCENARIOS: Final[dict[bool, tuple[str, ...]]] = {
    False: ("reject-all", "annotation-change", "names-reply", "error"),
    True: ("unknown-node", "unresolvable"),
}
RETRIED_NODE: Final = "node-warm"


def _wait(what: str, probe: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def _bound(api: KubeApi, pod: str) -> bool:
    return bool(api.get(f"/api/v1/namespaces/default/pods/{pod}")["spec"].get("nodeName"))


def _filters_of(recorder: _Recorder, pod: str) -> int:
    with recorder.lock:
        return sum(
            1
            for e in recorder.exchanges
            if e["meta"]["verb"] == "filter" and e["meta"]["pod"] == f"default/{pod}"
        )


def _run_scenario(
    api: KubeApi,
    recorder: _Recorder,
    scenario: str,
    pods: list[str],
    *,
    prefix: str,
    timeout_s: float,
) -> dict[str, Any]:
    """One case: its pod's exchanges tagged with `scenario`, its FailedScheduling messages."""
    recorder.scenario = scenario
    if scenario == "annotation-change":
        # The pod `reject-all` left pending, retried once a Node's annotation changes.
        pod = pods[-1]
        recorder.reply = "layout"
        _CURRENT[RETRIED_NODE] = 0.55
        api.merge_patch(
            f"/api/v1/nodes/{RETRIED_NODE}",
            {"metadata": {"annotations": {UTILIZATION_KEY: "0.55"}}},
        )
        _wait(f"{pod} to be bound after the change", lambda: _bound(api, pod), timeout_s)
        return {"scenario": scenario, "pod": pod, "messages": _failed_scheduling(api, pod)}
    pod = f"{prefix}{len(pods) + 1}"
    pods.append(pod)
    recorder.reply = scenario
    api.create("/api/v1/namespaces/default/pods", _pod(pod))
    # A rejected pod is tried again (at once, then with back-off); an `Error` reply is read
    # for three attempts, to show the back-off.
    attempts = 3 if scenario == "error" else 2
    _wait(
        f"{attempts} filter calls for {pod}",
        lambda: _filters_of(recorder, pod) >= attempts,
        timeout_s,
    )
    messages = _wait(
        f"a FailedScheduling event for {pod}", lambda: _failed_scheduling(api, pod), timeout_s
    )
    return {"scenario": scenario, "pod": pod, "messages": messages}


def _failed_scheduling(api: KubeApi, pod: str) -> list[str]:
    return [text for reason, text in pod_events(api, pod) if reason == "FailedScheduling"]


def _write_exchanges(folder: Path, exchanges: Sequence[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for seq, exchange in enumerate(exchanges, 1):
        meta = exchange["meta"]
        stem = folder / f"{seq:04d}-{meta['verb']}"
        stem.with_name(stem.name + ".request.json").write_bytes(exchange["request"])
        stem.with_name(stem.name + ".response.json").write_bytes(exchange["response"])
        meta = {**meta, "seq": seq}
        stem.with_name(stem.name + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n")


# ----------------------------------------------------------------------------- the API server


def _json_or_none(text: str | None) -> Any:
    """The body as JSON; None when there is none or it is not JSON (the malformed requests)."""
    try:
        return None if not text else json.loads(text)
    except ValueError:
        return None


def response_record(
    response: http.client.HTTPResponse, text: str, elapsed_ms: float
) -> dict[str, Any]:
    """An answer as the fixtures record it: status line, headers as received, exact body."""
    return {
        "http_version": f"HTTP/{response.version // 10}.{response.version % 10}",
        "status": response.status,
        "reason": response.reason,
        "headers": [[k, v] for k, v in response.getheaders()],
        "body": text,
        "elapsed_ms": round(elapsed_ms, 3),
        "body_json": _json_or_none(text),
    }


def _with_resource_version(body: str, api: KubeApi, node: str, offset: int) -> str:
    current = int(api.get(f"/api/v1/nodes/{node}")["metadata"]["resourceVersion"])
    document = json.loads(body)
    document["metadata"]["resourceVersion"] = str(current + offset)
    return json.dumps(document, separators=(",", ":"))


def capture_apiserver(plane: ControlPlane, earlier: Path, out: Path) -> None:
    """Each of `REPLAYED`'s requests sent again; the exchange written under the same name."""
    out.mkdir(parents=True, exist_ok=True)
    anonymous = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    context = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    context.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))
    connection = http.client.HTTPSConnection("127.0.0.1", plane.ports.apiserver, context=context)
    try:
        for name in REPLAYED:
            before = json.loads((earlier / name).read_text())
            request = before["request"]
            body = request.get("body")
            if body is None and name in UNSAVED_BODIES:
                body = UNSAVED_BODIES[name]
            offset = RESOURCE_VERSION_OFFSET.get(name)
            if offset is not None and body is not None:
                with plane.admin() as api:
                    body = _with_resource_version(body, api, request["path"].split("/")[4], offset)
            payload = None if body is None else body.encode()
            headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = request["headers"]["Content-Type"]
            with_cert = request.get("tls_client_certificate") is not None
            if "Authorization" in request["headers"]:
                headers["Authorization"] = INVALID_TOKEN
            if not with_cert:
                # A connection of its own: the admin one presents the client certificate.
                sender = http.client.HTTPSConnection(
                    "127.0.0.1", plane.ports.apiserver, context=anonymous
                )
            else:
                sender = connection
            started = time.perf_counter()
            sender.request(request["method"], request["path"], payload, headers)
            response = sender.getresponse()
            text = response.read().decode()
            elapsed_ms = (time.perf_counter() - started) * 1000
            if sender is not connection:
                sender.close()
            sent = {**headers, "Host": f"127.0.0.1:{plane.ports.apiserver}"}
            if "Authorization" in sent:
                sent["Authorization"] = "Bearer <INVALID-TOKEN>"
            if payload is not None:
                sent["Content-Length"] = str(len(payload))
            document = {
                "description": before["description"],
                "captured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "request": {
                    "method": request["method"],
                    "path": request["path"],
                    "headers": sent,
                    "tls_client_certificate": "CN=admin, O=system:masters" if with_cert else None,
                    **(
                        {"body": None, "body_description": request["body_description"]}
                        if name in UNSAVED_BODIES
                        else {"body": body, "body_json": _json_or_none(body)}
                    ),
                },
                "response": response_record(response, text, elapsed_ms),
            }
            (out / name).write_text(json.dumps(document, indent=1) + "\n")
    finally:
        connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopback_cluster.capture", description=__doc__)
    parser.add_argument("--from", dest="earlier", type=Path, required=True)
    parser.add_argument("--scheduler-out", type=Path, help="omitted: no scheduler capture")
    parser.add_argument("--apiserver-out", type=Path, help="omitted: no API server capture")
    args = parser.parse_args(argv)
    spec = BuildSpec.for_version()  # $LOOPBACK_KUBERNETES, else the newest pinned
    with tempfile.TemporaryDirectory() as scratch:
        if args.apiserver_out is not None:
            with running_control_plane(Path(scratch) / "apiserver") as plane:
                capture_apiserver(plane, args.earlier, args.apiserver_out)
        if args.scheduler_out is not None:
            with running_control_plane(Path(scratch) / "scheduler") as plane:
                capture_scheduler(plane, args.scheduler_out)
    print(f"captured from kube-apiserver and kube-scheduler {spec.kubernetes_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
