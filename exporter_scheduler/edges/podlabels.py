"""`gpu-scorer label-gpu-pods`: the GPU-pod label put on the pods created before the policy.

With `--pod-label-selector` the Pod watch sees only the pods that carry the label, which the
chart's MutatingAdmissionPolicy sets on each GPU pod as it is created. Pods created before the
policy existed lack it, and without it they would be unseen for as long as they run: not counted
in their spread groups, not teaching their workload's load. This command lists every pod that
has not finished and lacks the label once (the server does the selecting: `key!=true`, pages of
500), decodes each for its spec alone, and merge-patches the label onto each that asks for the
GPU resource, as the policy would have. The chart runs it as a post-install and post-upgrade
hook, after the policy exists, so a pod created meanwhile is labelled by one or the other.

Each patch names the pod's uid: a pod deleted and created again under the same name since the
LIST is answered 409 (or 404 when gone), counted as gone, and left to the policy. 429s, 5xx
answers and dropped connections are retried with back-off; any other refusal (403: no RBAC for
patch) is counted and named, and makes the exit status 1 once every pod has been tried.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

import msgspec

from exporter_scheduler.core.hints import GPU_POD_LABEL, GPU_POD_LABEL_VALUE
from exporter_scheduler.edges.listwatch import refusal_of
from exporter_scheduler.edges.podobjects import OBJECT, PAGE, PLACEMENT
from exporter_scheduler.serving.wire import WireError, pod_gpu_request
from gpu_contract.schema import Keys

log = logging.getLogger("exporter_scheduler.podlabels")

# Not finished: a Succeeded or Failed pod holds nothing and never runs again.
UNFINISHED: Final = "status.phase!=Succeeded,status.phase!=Failed"
PAGE_SIZE: Final = 500
MERGE_PATCH: Final = "application/merge-patch+json"
# Answers worth another try: throttled, the server's own trouble.
_RETRIED_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
_GONE_STATUSES: Final = frozenset({404, 409})


@dataclass(slots=True)
class LabelSummary:
    """What one run did, printed as one JSON line."""

    # Unfinished pods without the label, as the server listed them.
    listed: int = 0
    # Of those, the ones that ask for the GPU resource.
    gpu_pods: int = 0
    labelled: int = 0
    # Deleted (404) or replaced under the same name (409) between the LIST and the patch.
    gone: int = 0
    # Refused for another reason (the first reason kept in `error`).
    failed: int = 0
    error: str | None = None
    dry_run: bool = False

    def line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


def label_key(keys: Keys) -> str:
    return keys.prefix + GPU_POD_LABEL


def gpu_pods_of_page(items: list[msgspec.Raw], resource: str) -> Iterator[PodRef]:
    """The pods of one LIST page (raw Pods) that ask for `resource`, as the Pod watch counts
    them (any container or init container, requests or limits)."""
    for raw in items:
        try:
            if pod_gpu_request(PLACEMENT.decode(raw).spec, resource) <= 0:
                continue
        except WireError:  # a quantity the API server would not admit: as the watch, skipped
            continue
        meta = OBJECT.decode(raw).metadata
        if meta is not None and meta.name and meta.namespace:
            yield PodRef(meta.namespace, meta.name, meta.uid or "")


def label_gpu_pods(
    api: Any,
    *,
    keys: Keys,
    resource: str,
    dry_run: bool = False,
    page_size: int = PAGE_SIZE,
    attempts: int = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> LabelSummary:
    """Label every unfinished GPU pod that lacks the label; `api` is a kubernetes `CoreV1Api`.
    Raises `LabelError` when the LIST itself cannot be had."""
    calls = _Calls(attempts, sleep)
    key = label_key(keys)
    summary = LabelSummary(dry_run=dry_run)
    query: dict[str, Any] = {
        "field_selector": UNFINISHED,
        "label_selector": f"{key}!={GPU_POD_LABEL_VALUE}",
        "limit": page_size,
        "_preload_content": False,
    }
    while True:
        try:
            response = calls.retried(lambda: api.list_pod_for_all_namespaces(**query), "list pods")
        except RefusedError as refused:
            raise LabelError(str(refused)) from None
        try:
            page = PAGE.decode(response.data)
        finally:
            response.release_conn()
        items = page.items or []
        summary.listed += len(items)
        for pod in gpu_pods_of_page(items, resource):
            summary.gpu_pods += 1
            if not dry_run:
                _label(api, pod, key, summary, calls)
        meta = page.metadata
        continue_token = None if meta is None else meta.continue_
        if not continue_token:
            return summary
        query["_continue"] = continue_token


class LabelError(RuntimeError):
    """The pods could not be listed (after retries): nothing can be said of them."""


class RefusedError(Exception):
    """A call the API server refused for good (`status` 0: retries ran out on a transport
    failure)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _label(api: Any, pod: PodRef, key: str, summary: LabelSummary, calls: _Calls) -> None:
    metadata: dict[str, Any] = {"labels": {key: GPU_POD_LABEL_VALUE}}
    if pod.uid:
        metadata["uid"] = pod.uid  # a precondition: never the pod of the same name made since
    try:
        calls.retried(
            lambda: _drained(
                api.patch_namespaced_pod(
                    pod.name,
                    pod.namespace,
                    {"metadata": metadata},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            ),
            f"patch pod {pod.namespace}/{pod.name}",
        )
    except RefusedError as refused:
        if refused.status in _GONE_STATUSES:
            summary.gone += 1
            return
        summary.failed += 1
        if summary.error is None:
            summary.error = str(refused)
        log.warning(
            "pod not labelled",
            extra={"fields": {"pod": f"{pod.namespace}/{pod.name}", "why": str(refused)}},
        )
    else:
        summary.labelled += 1


def _drained(response: Any) -> None:
    """Read the answer (the patched Pod, not decoded) to its end, then release its connection.
    Released unread, the connection goes back to the pool with the body still on it: urllib3
    then finds its socket readable and drops it (a new TLS connection for the next patch), or,
    where the body was already buffered, hands it out again and the next request on it fails
    with `ResponseNotReady` (retried after a second). Paid per pod, that made labelling about
    ten times slower: 56 s instead of 5 s for 1,000 GPU pods among 5,000 on a loopback
    kube-apiserver v1.37."""
    try:
        response.data  # noqa: B018  # read for its effect: the body off the connection
    finally:
        response.release_conn()


@dataclass(frozen=True, slots=True)
class _Calls:
    attempts: int
    sleep: Callable[[float], None]

    def retried(self, call: Callable[[], Any], what: str) -> Any:
        """`call()`, tried again after 429, 5xx and dropped connections (1, 2, 4, ... s, at
        most 30); a refusal of another status, or the last failure, raises `RefusedError`."""
        delay_s = 1.0
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except Exception as exc:
                refusal = refusal_of(exc)
                if refusal is None:
                    raise
                status, message = refusal
                reason = f"{what}: {status} {message}" if status else f"{what}: {message}"
                if (status and status not in _RETRIED_STATUSES) or attempt == self.attempts:
                    raise RefusedError(status, reason) from None
            log.info("retrying", extra={"fields": {"what": what, "why": reason, "in_s": delay_s}})
            self.sleep(delay_s)
            delay_s = min(delay_s * 2, 30.0)
        raise AssertionError("unreachable: the last attempt returns or raises")
