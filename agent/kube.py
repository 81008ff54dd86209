"""The agent's only conversation with the Kubernetes API: merge-patching its own Node's annotations
(and, with per-process attribution on, naming the pods of its node by UID).

This is the one agent module that imports the `kubernetes` client. Everything it can go wrong with
is mapped, here and only here, onto a small error hierarchy (`ApiError` and its subclasses), so the
daemon decides retries and metrics on a few named classes and never on client internals.

Why these details:

* `CoreV1Api.patch_node` in kubernetes 36.x picks the *first* patch content type of its list,
  `application/json-patch+json`, and its REST layer then sends a dict body as
  `application/strategic-merge-patch+json`: a choice made by client internals, not by the contract.
  Every call therefore forces `application/merge-patch+json`, the JSON merge patch the contract
  defines.
* `fieldManager=gpu-scheduler-agent` makes the API server stamp the agent's last change time in
  `metadata.managedFields`, which the scorer uses to judge freshness without trusting node clocks.
* The body comes from `gpu_contract.merge_patch`, given the prefix keys last seen on the Node, so
  keys of the prefix that the schema does not define are removed with `null` while keys outside the
  prefix are never named (other writers' annotations survive).
* Each request has a connect and a read timeout, and urllib3's own retries are off: a hung API
  server costs one bounded wait per tick, and one attempt is one request (the limiter owns retries).
* The client is imported with its generated packages (`kubernetes.client`, `.api`, `.models`)
  resolved name by name on first use (`_import_client`): their `__init__` files import every API
  and ~770 model classes, about 45 MiB of the agent's RSS, while the agent uses one API class and,
  reading raw bodies, no model at all. Every name stays reachable, so nothing is lost.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import re
import socket
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import urllib3

from gpu_contract.media import METADATA_LIST
from gpu_contract.schema import DEFAULT_KEYS, FIELD_MANAGER, Keys, merge_patch

log = logging.getLogger(__name__)

# The client's generated packages whose `__init__` imports all of their modules.
_NAME_BY_NAME: Final = ("kubernetes.client", "kubernetes.client.api", "kubernetes.client.models")
# How a generated `__init__` names each class: `from kubernetes.client.models.v1_pod import V1Pod`.
_FROM_IMPORT: Final = re.compile(r"^from ([\w.]+) import (\w+)$", re.MULTILINE)


class _NameByNameLoader(importlib.abc.Loader):
    """Runs none of a generated package's `__init__`: reads its imports as a table instead, and
    imports the module behind a name when the name is first read (PEP 562 `__getattr__`)."""

    def __init__(self, init_path: str) -> None:
        self._init_path = init_path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        source = Path(self._init_path).read_text(encoding="utf-8")
        where = {name: origin for origin, name in _FROM_IMPORT.findall(source)}

        def resolve(name: str) -> Any:
            origin = where.get(name)
            if origin is None:  # a submodule (`from kubernetes.client import rest`) or unknown
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(origin), name)
            setattr(module, name, value)
            return value

        module.__getattr__ = resolve  # type: ignore[method-assign]


class _NameByNameFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAME_BY_NAME:
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None or found.origin is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            found.origin,
            loader=_NameByNameLoader(found.origin),
            submodule_search_locations=found.submodule_search_locations,
        )


def _import_client() -> tuple[Any, Any, Any]:
    """(`kubernetes.client`, `kubernetes.config`, `ApiException`), the generated packages
    resolved name by name unless something imported the client whole before."""
    finder = _NameByNameFinder()
    sys.meta_path.insert(0, finder)
    try:
        from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415
        from kubernetes.client.exceptions import (  # type: ignore[import-untyped]  # noqa: PLC0415
            ApiException,
        )
    finally:
        sys.meta_path.remove(finder)
    return client, config, ApiException


client, config, ApiException = _import_client()
# What the agent uses of the client, resolved now: at start-up, not on the first write (an
# image's precompiled bytecode covers them; a first use would compile CoreV1Api's 38,000 lines).
_API_CLIENT: Final = client.ApiClient
_CONFIGURATION: Final = client.Configuration
_CORE_V1_API: Final = client.CoreV1Api

MERGE_PATCH: Final = "application/merge-patch+json"
# The kubelet names a static pod by the hash of its manifest; the API's mirror pod carries that
# hash here, and it is the UID in the pod's cgroup.
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
DEFAULT_CONNECT_TIMEOUT_S: Final = 3.0
DEFAULT_READ_TIMEOUT_S: Final = 5.0


class ApiError(Exception):
    """A Node read or patch failed. `code` is the metric label: an HTTP status or `transport`.

    `retry_after_s` is the server's `Retry-After`, when it sent one (429 from API Priority and
    Fairness; 503 from the API server or a proxy in front of it): the limiter waits at least that.
    """

    code: str = "error"

    def __init__(
        self, message: str, *, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class UnauthorizedError(ApiError):
    code = "401"


class ForbiddenError(ApiError):
    code = "403"


class NotFoundError(ApiError):
    code = "404"


class ConflictError(ApiError):
    code = "409"


class TooManyRequestsError(ApiError):
    code = "429"

    def __init__(self, message: str, *, retry_after_s: float | None) -> None:
        super().__init__(message, status=429, retry_after_s=retry_after_s)


class ServerError(ApiError):
    """5xx: the API server (or a proxy in front of it) failed; `code` is the exact status."""

    def __init__(self, message: str, *, status: int, retry_after_s: float | None = None) -> None:
        super().__init__(message, status=status, retry_after_s=retry_after_s)
        self.code = str(status)


class ClientError(ApiError):
    """Any other 4xx (400, 415, 422, ...): the request itself was refused."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, status=status)
        self.code = str(status)


class TransportError(ApiError):
    """No HTTP answer: connection refused or reset, timeout, TLS failure."""

    code = "transport"


def _retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                seconds = float(value.strip())
            except ValueError:
                # An HTTP date is allowed by RFC 9110 but never sent by kube-apiserver; fall back
                # to the exponential backoff rather than parse clocks we do not trust.
                return None
            return seconds if seconds >= 0 else None
    return None


def _status_message(body: object) -> str:
    """The `message` of a Kubernetes Status body, or a short excerpt of whatever came back."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:200]
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])[:300]
    return body[:200]


def classify(exc: BaseException, *, node_name: str, action: str | None = None) -> ApiError:
    """Map any failure of a client call onto the error hierarchy, with an operator's message.

    `action` (e.g. "creating DeviceTaintRule x") names a request other than the Node patch, for
    the 403, 404 and 409 messages.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ApiException) and exc.status and action is not None:
        status = int(exc.status)
        detail = _status_message(exc.body)
        if status == 403:
            return ForbiddenError(
                f"API server forbade {action} (403 Forbidden): the agent's ServiceAccount needs "
                f"the chart's RBAC for DRA; server said: {detail}",
                status=status,
            )
        if status == 404:
            return NotFoundError(f"{action}: not found (404): {detail}", status=status)
        if status == 409:
            return ConflictError(f"conflict {action} (409): {detail}", status=status)
    if isinstance(exc, ApiException) and exc.status:
        status = int(exc.status)
        detail = _status_message(exc.body)
        headers = dict(exc.headers) if exc.headers else None
        if status == 401:
            return UnauthorizedError(
                "API server rejected the agent's credentials (401 Unauthorized): check the "
                "ServiceAccount token mounted in the pod (automountServiceAccountToken) or the "
                f"kubeconfig's user; server said: {detail}",
                status=status,
            )
        if status == 403:
            return ForbiddenError(
                f"API server forbade patching node {node_name!r} (403 Forbidden): the agent's "
                "ServiceAccount needs a ClusterRole with 'get' and 'patch' on 'nodes' bound to it; "
                f"server said: {detail}",
                status=status,
            )
        if status == 404:
            return NotFoundError(
                f"node {node_name!r} not found (404): check --node-name / NODE_NAME "
                "(the chart sets it from spec.nodeName); will re-read the node and retry",
                status=status,
            )
        if status == 409:
            return ConflictError(
                f"conflict patching node {node_name!r} (409): {detail}; will re-read the node",
                status=status,
            )
        if status == 429:
            retry_after_s = _retry_after_s(headers)
            return TooManyRequestsError(
                f"API server throttled the agent (429 Too Many Requests, Retry-After "
                f"{retry_after_s if retry_after_s is not None else 'absent'}): {detail}",
                retry_after_s=retry_after_s,
            )
        if 500 <= status <= 599:
            retry_after_s = _retry_after_s(headers)
            return ServerError(
                f"API server error {status}: {detail}", status=status, retry_after_s=retry_after_s
            )
        return ClientError(f"API server refused the patch ({status}): {detail}", status=status)
    if isinstance(exc, ApiException):
        # status 0: the client wraps TLS failures this way.
        return TransportError(f"API server unreachable: {exc.reason}")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | socket.timeout):
        return TransportError(f"API server unreachable: {type(exc).__name__}: {exc}")
    return TransportError(
        f"unexpected error talking to the API server: {type(exc).__name__}: {exc}"
    )


def pods_by_uid(listed: object) -> dict[str, str]:
    """Pod UID (and a mirror pod's manifest hash) -> `namespace/name`, from a pod LIST body.

    Items without a namespace, name or UID are skipped: a reader of a malformed list gets the
    pods it can name, not an error.
    """
    items = listed.get("items") if isinstance(listed, dict) else None
    found: dict[str, str] = {}
    for item in items if isinstance(items, list) else ():
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            continue
        namespace, name, uid = (metadata.get(k) for k in ("namespace", "name", "uid"))
        if not (isinstance(namespace, str) and isinstance(name, str) and namespace and name):
            continue
        ref = f"{namespace}/{name}"
        if isinstance(uid, str) and uid:
            found[uid.lower()] = ref
        annotations = metadata.get("annotations")
        mirror = annotations.get(MIRROR_ANNOTATION) if isinstance(annotations, dict) else None
        if isinstance(mirror, str) and mirror:
            found[mirror.lower()] = ref
    return found


class CredentialsMissingError(Exception):
    """No usable API configuration at start-up; the message says which one was tried."""


def api_client_for(kubeconfig: str | None) -> Any:
    """An API client from a kubeconfig file, or from the pod's in-cluster ServiceAccount."""
    configuration = _CONFIGURATION()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = (
            f"kubeconfig {kubeconfig!r}"
            if kubeconfig
            else "the in-cluster config (KUBERNETES_SERVICE_HOST and the mounted ServiceAccount "
            "token; outside a cluster pass --kubeconfig)"
        )
        raise CredentialsMissingError(f"cannot load {where}: {exc}") from None
    # One attempt is one request: the limiter decides retries, with backoff.
    configuration.retries = False
    return _API_CLIENT(configuration)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_s: float = DEFAULT_READ_TIMEOUT_S


class NodeAnnotator:
    """Merge-patches the agent's annotations onto one Node; remembers its prefix keys."""

    def __init__(
        self,
        api_client: Any,
        *,
        node_name: str,
        keys: Keys = DEFAULT_KEYS,
        timeouts: Timeouts = Timeouts(),
    ) -> None:
        self._core = _CORE_V1_API(api_client)
        self._api_client = api_client
        self.node_name = node_name
        self.keys = keys
        self._timeouts = timeouts
        # Prefix keys as last seen on the Node; None until the Node has been read.
        self._seen: dict[str, str] | None = None

    @property
    def needs_refresh(self) -> bool:
        return self._seen is None

    def refresh(self) -> None:
        """Read the Node once to learn which prefix keys it carries (e.g. an older schema's)."""
        try:
            response = self._core.read_node(
                self.node_name,
                _preload_content=False,
                _request_timeout=(self._timeouts.connect_s, self._timeouts.read_s),
            )
            node = json.loads(response.data)
        except Exception as exc:
            raise classify(exc, node_name=self.node_name) from exc
        self._seen = self._prefix_annotations(node)

    def patch_body(self, annotations: Mapping[str, str]) -> dict[str, Any]:
        """The merge patch that makes the Node's prefix keys exactly `annotations`."""
        return merge_patch(annotations, self.keys, current=self._seen)

    def patch(self, annotations: Mapping[str, str]) -> None:
        """Send one merge patch; raises `ApiError`. After a 404/409 the next call re-reads first."""
        if self._seen is None:
            try:
                self.refresh()
            except ForbiddenError as exc:
                # Allowed to patch but not to read: write anyway. Only keys of an older schema
                # stay behind until this patch's answer (the whole Node) shows them.
                log.warning(
                    "cannot read node %r before writing (403); grant 'get' on 'nodes' so that "
                    "stale annotation keys are removed at once: %s",
                    self.node_name,
                    exc,
                )
        body = self.patch_body(annotations)
        try:
            response = self._core.patch_node(
                self.node_name,
                body,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=(self._timeouts.connect_s, self._timeouts.read_s),
            )
            node = json.loads(response.data)
        except Exception as exc:
            error = classify(exc, node_name=self.node_name)
            if isinstance(error, NotFoundError | ConflictError):
                self._seen = None
            raise error from exc
        self._seen = self._prefix_annotations(node)

    def pods_by_uid(self) -> dict[str, str]:
        """Pod UID -> `namespace/name` of every pod on this node; raises `ApiError`.

        One LIST of pods with `fieldSelector=spec.nodeName=<node>` and `resourceVersion=0`
        (served from the API server's watch cache, indexed by node name), asking for metadata
        only (`PartialObjectMetadataList`, what `kubectl get` asks for; a server that cannot
        answers the full list, read the same way). Needs `list` on `pods`.
        """
        try:
            # Through `call_api`: `CoreV1Api.list_pod_for_all_namespaces` overwrites any Accept
            # header passed in `_headers` with its own, so it cannot ask for metadata only.
            response = self._api_client.call_api(
                "/api/v1/pods",
                "GET",
                query_params=[
                    ("fieldSelector", f"spec.nodeName={self.node_name}"),
                    ("resourceVersion", "0"),
                ],
                header_params={"Accept": METADATA_LIST},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=(self._timeouts.connect_s, self._timeouts.read_s),
            )
            listed = json.loads(response.data)
        except Exception as exc:
            raise classify(exc, node_name=self.node_name) from exc
        return pods_by_uid(listed)

    def close(self) -> None:
        self._api_client.close()

    def _prefix_annotations(self, node: object) -> dict[str, str]:
        annotations: object = None
        if isinstance(node, dict):
            metadata = node.get("metadata")
            if isinstance(metadata, dict):
                annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            return {}
        return {
            str(k): str(v)
            for k, v in annotations.items()
            if isinstance(k, str) and k.startswith(self.keys.prefix)
        }
