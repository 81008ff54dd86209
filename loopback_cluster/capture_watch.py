"""Record the kube-apiserver exchanges that need a set-up of their own, as test fixtures.

`loopback_cluster.capture` replays the earlier minor's requests that need nothing but the
Nodes the ones before them made. The rest are recorded here, on a control plane of their own,
in the earlier capture's order and formats (`tests/fixtures/kube-apiserver-v1.36/README.md`):

- `42`/`43`: a PATCH and a GET with the token of ServiceAccount `default/nobody`, which no
  RBAC binding names (the token minted with the TokenRequest API, shown redacted);
- the watches, each written as its decoded body (`NN-*.ndjson`) and `NN-*.meta.json` (the raw
  request, the status line, the headers, the chunk sizes, the socket reads and when they came):
  `53` a streaming list (`sendInitialEvents`), `51` a watch from a LIST's resourceVersion with
  `timeoutSeconds=20` while another connection patches gpu-node-1 twice, creates gpu-node-2 and
  deletes it (that DELETE is `54`), `52` a bookmarks-only watch of 75 s (it runs while the
  cases after it are recorded), `62` a watch from resourceVersion 1 after 200 patches, `63` from
  one far in the future, `63b` from one a few revisions ahead while gpu-node-1 is patched;
- `64` etcd compacted (through its HTTP/JSON gateway, `/v3/kv/compaction`) two revisions below
  the newest, then `65` a watch from 1, `66` one from a compacted revision the watch cache
  still holds, `67` an exact LIST at that revision, `68` the continue token a paged LIST gave
  before the compaction, `69` an exact LIST at revision 1;
- `70` `kubectl describe node gpu-node-1` (the kubectl under `.tools/bin`, else on `PATH`);
- kube-apiserver restarted with `--anonymous-auth=false`: `41b` a PATCH with no credentials,
  `67b` a watch from gpu-node-1's resourceVersion before the restart.

The 200 patches wait until 80 s after the set-up began (`HISTORY_WINDOW_S`), as they came two
minutes after it in the earlier capture: only then does the watch cache drop the set-up's
events and answer a watch from resourceVersion 1 with 410. A run takes about two minutes.

    LOOPBACK_KUBERNETES=v1.37 python -m loopback_cluster.capture_watch \\
        --from tests/fixtures/kube-apiserver-v1.36 --out tests/fixtures/kube-apiserver-v1.37
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from loopback_cluster.capture import USER_AGENT, _json_or_none, response_record
from loopback_cluster.control_plane import (
    LOOPBACK,
    ROOT,
    BuildSpec,
    ControlPlane,
    ManagedProcess,
    Ports,
)

ADMIN_CERT: Final = "CN=admin, O=system:masters"
REDACTED: Final = "Bearer <REDACTED-SERVICEACCOUNT-TOKEN>"
MERGE: Final = "application/merge-patch+json"
# The earlier capture's requests that build gpu-node-1 as its `70` showed it, sent again first.
SET_UP: Final = (
    "01-create-node.json",
    "02-patch-node-status.json",
    "10-merge-patch-annotations.json",
    "11-merge-patch-change-and-remove.json",
    "20-strategic-merge-patch.json",
    "21-json-patch.json",
)
NODE: Final = "/api/v1/nodes/gpu-node-1?fieldManager=gpu-scheduler-agent"
NOBODY: Final = "nobody"
# The patches before `62` (the earlier capture's burst), and after `63b`'s watch starts.
BURST: Final = 200
AHEAD: Final = 6
AHEAD_PATCHES: Final = 8
# kube-apiserver's watch cache keeps a resource's events for 75 s at least (its buffer doubles
# while the oldest event is younger); the burst comes later than that after the set-up, as in
# the earlier capture, so that the full buffer drops the set-up's events and a watch from
# resourceVersion 1 is too old (`62`) rather than replayed from the first Node event on.
HISTORY_WINDOW_S: Final = 80.0


class _Plane(ControlPlane):
    """The loopback control plane, its kube-apiserver started with `extra_flags` as well."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.extra_flags: list[str] = []

    def apiserver(self) -> ManagedProcess:
        process = super().apiserver()
        return dataclasses.replace(process, argv=[*process.argv, *self.extra_flags])


# ----------------------------------------------------------------------------- the wire


@dataclasses.dataclass
class _Client:
    """Requests as the earlier capture made them: `http.client`, HTTP/1.1, one per call."""

    port: int
    admin: ssl.SSLContext
    bare: ssl.SSLContext

    def exchange(
        self,
        method: str,
        path: str,
        body: str | None = None,
        *,
        content_type: str | None = None,
        token: str | None = None,
        with_cert: bool = True,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request (headers as sent, a token redacted) and the whole response."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        context = self.admin if with_cert else self.bare
        connection = http.client.HTTPSConnection(LOOPBACK, self.port, context=context)
        payload = None if body is None else body.encode()
        try:
            started = time.perf_counter()
            connection.request(method, path, payload, headers)
            response = connection.getresponse()
            text = response.read().decode()
            elapsed_ms = (time.perf_counter() - started) * 1000
        finally:
            connection.close()
        sent = {**headers, "Host": f"{LOOPBACK}:{self.port}"}
        if token is not None:
            sent["Authorization"] = REDACTED
        if payload is not None:
            sent["Content-Length"] = str(len(payload))
        request: dict[str, Any] = {
            "method": method,
            "path": path,
            "headers": sent,
            "tls_client_certificate": ADMIN_CERT if with_cert else None,
        }
        if body is not None:
            request |= {"body": body, "body_json": _json_or_none(body)}
        return request, response_record(response, text, elapsed_ms)

    def json(self, method: str, path: str, body: object | None = None, **kw: Any) -> Any:
        """A set-up request's JSON answer; anything but 2xx is an error."""
        text = None if body is None else json.dumps(body, separators=(",", ":"))
        _, answer = self.exchange(method, path, text, **kw)
        if not 200 <= answer["status"] < 300:
            raise RuntimeError(f"{method} {path}: {answer['status']} {answer['body'][:300]}")
        return answer["body_json"]

    def patch(self, utilization: str) -> str:
        """The agent's merge patch of gpu-node-1; the resourceVersion it made."""
        body = {"metadata": {"annotations": {"gpu-scheduler.example.com/utilization": utilization}}}
        node = self.json("PATCH", NODE, body, content_type=MERGE)
        return str(node["metadata"]["resourceVersion"])


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _watch(
    client: _Client,
    path: str,
    description: str,
    *,
    during: Callable[[float], list[dict[str, Any]]] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """One watch read off the socket until the terminating chunk: its meta and decoded body.

    `during(t0)` runs in a thread of its own once the request is sent (t0 its
    `perf_counter`); what it returns is the meta's `side_requests_during_watch`.
    """
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {LOOPBACK}:{client.port}",
        f"User-Agent: {USER_AGENT}",
        "Accept: application/json",
        "",
        "",
    ]
    raw = "\r\n".join(lines)
    plain = socket.create_connection((LOOPBACK, client.port), timeout=120)
    sock = client.admin.wrap_socket(plain, server_hostname=LOOPBACK)
    side: list[dict[str, Any]] = []
    worker = None
    reads: list[list[float]] = []
    received = b""
    head: bytes | None = None
    chunks: list[bytes] = []
    try:
        t0 = time.perf_counter()
        sock.sendall(raw.encode())
        if during is not None:
            worker = threading.Thread(target=lambda: side.extend(during(t0)), daemon=True)
            worker.start()
        position = 0
        finished = False
        while not finished:
            data = sock.recv(65536)
            if not data:
                break
            reads.append([round(time.perf_counter() - t0, 3), len(data)])
            received += data
            if head is None:
                end = received.find(b"\r\n\r\n")
                if end < 0:
                    continue
                head, position = received[:end], end + 4
            while True:  # every whole chunk received so far
                line_end = received.find(b"\r\n", position)
                if line_end < 0:
                    break
                size = int(received[position:line_end].split(b";")[0], 16)
                if len(received) < line_end + 2 + size + 2:
                    break
                if size == 0:
                    finished = True
                    break
                chunks.append(received[line_end + 2 : line_end + 2 + size])
                position = line_end + 2 + size + 2
    finally:
        sock.close()
        if worker is not None:
            worker.join()
    assert head is not None, f"no response to {path}"
    status_line, *header_lines = head.decode().split("\r\n")
    headers = [list(line.split(": ", 1)) for line in header_lines]
    body = b"".join(chunks)
    summary = []
    for line in body.splitlines(keepends=True):
        event = json.loads(line)
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        summary.append(
            {
                "type": event.get("type"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": meta.get("annotations"),
                "code": obj.get("code"),
                "bytes": len(line),
            }
        )
    document: dict[str, Any] = {
        "description": description,
        "captured_at": _now(),
        "request": {"raw": raw.replace("\r\n", "\\r\\n\n")},
        "response_status_line": status_line,
        "response_headers": headers,
        "wire_chunk_count": len(chunks),
        "wire_chunk_sizes": [len(c) for c in chunks],
        "socket_reads_t_rel_s_and_bytes": reads,
        "events_summary": summary,
        "body_bytes": len(body),
    }
    if during is not None:
        document["side_requests_during_watch"] = side
    return document, body


def _sleep_until(t0: float, at_s: float) -> None:
    time.sleep(max(0.0, t0 + at_s - time.perf_counter()))


# ----------------------------------------------------------------------------- the capture


@dataclasses.dataclass
class _Recording:
    plane: _Plane
    client: _Client
    earlier: Path
    out: Path
    started: float = dataclasses.field(default_factory=time.monotonic)

    def before(self, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.earlier / name).read_text())
        return document

    def write(self, name: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        document = {
            "description": self.before(name)["description"],
            "captured_at": _now(),
            "request": request,
            "response": response,
        }
        (self.out / name).write_text(json.dumps(document, indent=1) + "\n")

    def write_watch(self, stem: str, meta: dict[str, Any], body: bytes) -> None:
        (self.out / f"{stem}.ndjson").write_bytes(body)
        meta = {**meta, "body_file": f"{stem}.ndjson"}
        (self.out / f"{stem}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    def replay(self, name: str) -> dict[str, Any]:
        request = self.before(name)["request"]
        request_headers = request["headers"]
        _, answer = self.client.exchange(
            request["method"],
            request["path"],
            request.get("body"),
            content_type=request_headers.get("Content-Type"),
        )
        return answer

    def list_rv(self, query: str = "") -> str:
        return str(self.client.json("GET", f"/api/v1/nodes{query}")["metadata"]["resourceVersion"])


def _service_account_token(client: _Client) -> str:
    client.json(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NOBODY}},
    )
    review = client.json(
        "POST",
        f"/api/v1/namespaces/default/serviceaccounts/{NOBODY}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    return str(review["status"]["token"])


def _service_account_cases(rec: _Recording) -> None:
    token = _service_account_token(rec.client)
    for name in ("42-err-403-serviceaccount-no-rbac.json", "43-err-403-serviceaccount-get.json"):
        request = rec.before(name)["request"]
        sent, answer = rec.client.exchange(
            request["method"],
            request["path"],
            request.get("body"),
            content_type=request["headers"].get("Content-Type"),
            token=token,
            with_cert=False,
        )
        rec.write(name, sent, answer)


def _describe(rec: _Recording) -> None:
    kubectl = ROOT / ".tools" / "bin" / "kubectl"
    binary = str(kubectl) if kubectl.exists() else shutil.which("kubectl")
    if binary is None:
        print("kubectl not found: 70 not recorded", file=sys.stderr)
        return
    text = subprocess.run(
        [binary, f"--kubeconfig={rec.plane.admin_kubeconfig}", "describe", "node", "gpu-node-1"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (rec.out / "70-kubectl-describe-node.txt").write_text(text)


def _watch_with_changes(rec: _Recording) -> None:
    """`51` from a LIST's resourceVersion while gpu-node-2 comes and goes (`55`, `54`)."""
    rv = rec.list_rv()
    node_2 = rec.before("55-create-node-2.json")["request"]["body"]
    deleted: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def changes(t0: float) -> list[dict[str, Any]]:
        side = []
        for at_s, utilization in ((1.0, "0.33"), (2.0, "0.34")):
            _sleep_until(t0, at_s)
            made = rec.client.patch(utilization)
            side.append(
                {
                    "t_rel_s": round(time.perf_counter() - t0, 3),
                    "req": f"PATCH {NODE} merge-patch utilization={utilization}",
                    "status": 200,
                    "resourceVersion": made,
                }
            )
        _sleep_until(t0, 3.0)
        _, answer = rec.client.exchange("POST", "/api/v1/nodes?fieldManager=fixture-setup", node_2)
        side.append(
            {
                "t_rel_s": round(time.perf_counter() - t0, 3),
                "req": "POST /api/v1/nodes gpu-node-2",
                "status": answer["status"],
                "resourceVersion": answer["body_json"]["metadata"]["resourceVersion"],
            }
        )
        _sleep_until(t0, 4.0)
        at = round(time.perf_counter() - t0, 3)
        deleted.append(rec.client.exchange("DELETE", "/api/v1/nodes/gpu-node-2"))
        answer = deleted[0][1]
        side.append(
            {
                "t_rel_s": at,
                "req": "DELETE /api/v1/nodes/gpu-node-2",
                "status": answer["status"],
                "response_kind": (answer["body_json"] or {}).get("kind"),
            }
        )
        return side

    path = f"/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=20"
    meta, body = _watch(
        rec.client,
        path,
        f"GET {path} (rv from a LIST) while another connection patches gpu-node-1 twice, "
        "creates and deletes gpu-node-2",
        during=changes,
    )
    meta["notes"] = {"list_resourceVersion": rv}
    rec.write_watch("51-watch-nodes-timeout20", meta, body)
    rec.write("54-delete-node.json", *deleted[0])


def _bookmarks_only(rec: _Recording) -> threading.Thread:
    """`52`, 75 s long: started here, written when it ends."""
    path = (
        "/api/v1/nodes?watch=1&allowWatchBookmarks=true&fieldSelector="
        f"{quote('metadata.name=no-such-node')}&timeoutSeconds=75"
    )
    description = rec.before("52-watch-bookmarks-only-timeout75.meta.json")["description"]

    def run() -> None:
        meta, body = _watch(rec.client, path, description)
        rec.write_watch("52-watch-bookmarks-only-timeout75", meta, body)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _compaction(rec: _Recording) -> None:
    """`60`, `61` (not written: recorded by `loopback_cluster.capture`), the 200 patches,
    `62`, `63`, `64` (compaction), `65`, `66`, `63b`, `67`, `68` and `69`."""
    time.sleep(max(0.0, rec.started + HISTORY_WINDOW_S - time.monotonic()))
    rec.replay("60-create-node-3.json")
    page = rec.client.json("GET", "/api/v1/nodes?limit=1")
    listed, token = str(page["metadata"]["resourceVersion"]), page["metadata"]["continue"]
    started = time.perf_counter()
    made = [rec.client.patch(f"{i / 1000:.3f}") for i in range(BURST)]
    burst_s = round(time.perf_counter() - started, 2)

    path = "/api/v1/nodes?watch=1&resourceVersion=1&timeoutSeconds=5"
    meta, body = _watch(rec.client, path, f"GET {path} after {BURST} patches, before compaction")
    rec.write_watch("62-watch-rv1-too-old", meta, body)
    path = "/api/v1/nodes?watch=1&resourceVersion=999999999&timeoutSeconds=10"
    meta, body = _watch(rec.client, path, f"GET {path} (RV far in the future)")
    rec.write_watch("63-watch-rv-in-future", meta, body)

    revision = int(made[-1]) - 2
    compaction = {"revision": str(revision), "physical": True}
    etcd = http.client.HTTPConnection(LOOPBACK, rec.plane.ports.etcd_client, timeout=30)
    try:
        started_compaction = time.perf_counter()
        etcd.request("POST", "/v3/kv/compaction", json.dumps(compaction))
        reply = etcd.getresponse()
        reply_text = reply.read().decode()
        compaction_s = round(time.perf_counter() - started_compaction, 3)
    finally:
        etcd.close()
    if reply.status != 200:
        raise RuntimeError(f"etcd compaction: {reply.status} {reply_text}")
    document = {
        "description": f"{BURST} sequential merge patches of gpu-node-1 (utilization "
        f"0.000..{(BURST - 1) / 1000:.3f}), not saved one by one, then etcd compacted",
        "captured_at": _now(),
        "seconds": burst_s,
        "first_rv": made[0],
        "last_rv": made[-1],
        "rv_before (from 61)": listed,
        "etcd_compaction": {
            "request": f"POST http://{LOOPBACK}:2379/v3/kv/compaction {json.dumps(compaction)}",
            "response": reply_text.strip(),
            "seconds": compaction_s,
        },
    }
    (rec.out / "64-etcd-compaction.json").write_text(json.dumps(document, indent=1) + "\n")

    path = "/api/v1/nodes?watch=1&resourceVersion=1&timeoutSeconds=5"
    meta, body = _watch(rec.client, path, f"GET {path} after etcd compaction")
    rec.write_watch("65-watch-rv1-after-compaction", meta, body)
    selector = quote("metadata.name=gpu-node-3")
    path = (
        f"/api/v1/nodes?watch=1&resourceVersion={listed}&fieldSelector={selector}&timeoutSeconds=3"
    )
    meta, body = _watch(
        rec.client,
        path,
        f"GET {path}: rv {listed} is older than the etcd compaction revision {revision}",
    )
    rec.write_watch("66-watch-compacted-rv-from-cache", meta, body)

    current = int(rec.list_rv())
    ahead = current + AHEAD

    def patches(t0: float) -> list[dict[str, Any]]:
        _sleep_until(t0, 0.9)
        side = []
        for i in range(AHEAD_PATCHES):
            utilization = f"{0.90 + i / 100:.2f}"
            side.append(
                {
                    "utilization": utilization,
                    "status": 200,
                    "resourceVersion": rec.client.patch(utilization),
                }
            )
            time.sleep(0.2)
        return side

    selector = quote("metadata.name=gpu-node-1")
    path = (
        f"/api/v1/nodes?watch=1&resourceVersion={ahead}&fieldSelector={selector}&timeoutSeconds=6"
    )
    meta, body = _watch(
        rec.client,
        path,
        f"GET {path} where {ahead} = current RV {current} + {AHEAD}, then {AHEAD_PATCHES} "
        f"patches: events with RV <= {ahead} are not delivered",
        during=patches,
    )
    rec.write_watch("63b-watch-rv-slightly-in-future", meta, body)

    for name, path in (
        (
            "67-list-exact-compacted-rv.json",
            f"/api/v1/nodes?resourceVersion={listed}&resourceVersionMatch=Exact",
        ),
        ("68-list-continue-after-compaction.json", f"/api/v1/nodes?limit=1&continue={token}"),
        ("69-list-exact-rv1.json", "/api/v1/nodes?resourceVersion=1&resourceVersionMatch=Exact"),
    ):
        rec.write(name, *rec.client.exchange("GET", path))


def _after_restart(rec: _Recording) -> None:
    """kube-apiserver restarted with `--anonymous-auth=false`: `41b`, then `67b`."""
    before = rec.client.patch("0.50")
    rec.plane.stop_apiserver()
    rec.plane.extra_flags = ["--anonymous-auth=false"]
    rec.plane.start_apiserver()
    request = rec.before("41b-err-401-no-credentials-anonymous-off.json")["request"]
    rec.write(
        "41b-err-401-no-credentials-anonymous-off.json",
        *rec.client.exchange(
            "PATCH", request["path"], request["body"], content_type=MERGE, with_cert=False
        ),
    )
    listed = rec.list_rv()
    path = (
        f"/api/v1/nodes?watch=1&resourceVersion={before}&allowWatchBookmarks=true&timeoutSeconds=3"
    )
    meta, body = _watch(
        rec.client,
        path,
        f"GET {path} right after kube-apiserver was restarted ({before} = gpu-node-1's RV "
        f"before the restart; current list RV {listed}; etcd compacted earlier)",
    )
    rec.write_watch("67b-watch-rv-from-before-apiserver-restart", meta, body)


def capture(plane: _Plane, earlier: Path, out: Path) -> None:
    """Every case, in the earlier capture's order, written under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    admin = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    admin.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))
    bare = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    rec = _Recording(plane, _Client(plane.ports.apiserver, admin, bare), earlier, out)
    for name in SET_UP:
        answer = rec.replay(name)
        if answer["status"] not in (200, 201):
            raise RuntimeError(f"set-up {name}: {answer['status']} {answer['body'][:300]}")
    _describe(rec)
    _service_account_cases(rec)
    path = (
        "/api/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        "&allowWatchBookmarks=true&timeoutSeconds=4"
    )
    description = rec.before("53-watchlist-sendInitialEvents.meta.json")["description"]
    rec.write_watch("53-watchlist-sendInitialEvents", *_watch(rec.client, path, description))
    _watch_with_changes(rec)
    bookmarks = _bookmarks_only(rec)
    _compaction(rec)
    bookmarks.join()  # before the restart, which would end it
    _after_restart(rec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loopback_cluster.capture_watch", description=__doc__
    )
    parser.add_argument("--from", dest="earlier", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = BuildSpec.for_version()  # $LOOPBACK_KUBERNETES, else the newest pinned
    with tempfile.TemporaryDirectory() as scratch:
        plane = _Plane(Path(scratch) / "plane", Ports.free(), spec=spec, tie_to_parent=True)
        plane.up()
        try:
            capture(plane, args.earlier, args.out)
        finally:
            plane.down()
    print(f"captured from kube-apiserver {spec.kubernetes_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
