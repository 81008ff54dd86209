"""The one module that talks to the kubelet's pod-resources gRPC API (and imports grpc).

Two unary calls of service `v1.PodResourcesLister` over the kubelet's unix socket:
`GetAllocatableResources` (every device the kubelet can hand out) and `List` (the devices assigned
to each container). grpc carries raw bytes both ways (no serializer, no deserializer): the
requests are empty messages and `agent.podresources_wire` decodes the replies, so the protobuf
runtime never loads. Every failure is classified where it enters, as a `PodResourcesError` whose
`reason` is the agent's metric label:

| reason | what happened |
| --- | --- |
| `socket-missing` | no socket at the path (kubelet not running, or the directory is not mounted) |
| `not-a-socket` | something else is at the path |
| `permission-denied` | the socket exists but this user may not connect (it is root's, mode 0755) |
| `refused` | the socket exists but nothing answers on it (kubelet restarting) |
| `timeout` | no answer within the timeout |
| `unimplemented` | the kubelet does not serve v1 `List` or `GetAllocatableResources` (too old) |
| `bad-response` | the answer does not decode as the expected message |
| `error` | any other gRPC status |
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

import grpc

from agent.allocations import DEFAULT_POD_RESOURCES_SOCKET, AllocationQueryError
from agent.podresources_wire import (
    WireError,
    decode_allocatable_response,
    decode_list_response,
)
from agent.records import DeviceAllocations, PodDevices
from gpu_contract.podusage import pod_ref

DEFAULT_SOCKET: Final = DEFAULT_POD_RESOURCES_SOCKET
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD: Final = "/v1.PodResourcesLister/GetAllocatableResources"
# The kubelet's own limit for this API's messages (16 MiB); grpc's default of 4 MiB could cut
# a List of a node running many pods.
_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
_CHANNEL_OPTIONS: Final = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.enable_http_proxy", 0),
    # The agent asks again on its own schedule; grpc's own reconnect back-off (up to 120 s by
    # default) would otherwise refuse calls long after the kubelet is back.
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 5000),
)
_EMPTY_REQUEST: Final = b""


class PodResourcesError(AllocationQueryError):
    """A failed query; `reason` is one of `QUERY_FAILURE_REASONS`, the message what to check."""


def check_socket(path: str) -> None:
    """Classify the faults a stat can see, before grpc turns them all into UNAVAILABLE."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise PodResourcesError(
            "socket-missing",
            f"no kubelet pod-resources socket at {path} (is the directory mounted into the pod?)",
        ) from None
    except PermissionError:
        raise PodResourcesError(
            "permission-denied", f"may not look up {path} as uid {os.getuid()}"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise PodResourcesError("not-a-socket", f"{path} is not a unix socket")
    if not os.access(path, os.W_OK):
        raise PodResourcesError(
            "permission-denied",
            f"uid {os.getuid()} may not connect to {path} (the kubelet's socket is root's): run "
            "the agent as uid 0, or turn --pod-resources off",
        )


def _classify(error: grpc.RpcError, method: str) -> PodResourcesError:
    code = error.code() if isinstance(error, grpc.Call) else None
    details = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError(
            "unimplemented",
            f"the kubelet does not serve {method} (pod-resources v1; Kubernetes 1.28 or newer "
            f"has both calls): {details}",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError("timeout", f"{method} did not answer in time")
    if code == grpc.StatusCode.UNAVAILABLE:
        if "permission denied" in details.lower() or f"errno {errno.EACCES}" in details:
            return PodResourcesError("permission-denied", f"{method}: {details}")
        return PodResourcesError("refused", f"nothing answers on the socket ({method}): {details}")
    name = code.name if code is not None else type(error).__name__
    return PodResourcesError("error", f"{method} failed ({name}): {details}")


class PodResourcesClient:
    """Reads device allocations from the kubelet; one channel, re-made after a failure."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 1.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None

    def _call(self, method: str) -> bytes:
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix:{os.path.abspath(self.socket_path)}", options=list(_CHANNEL_OPTIONS)
            )
        # No serializers: the request is the empty message's (empty) encoding, the reply raw.
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
        try:
            reply = call(_EMPTY_REQUEST, timeout=self.timeout_s)
        except grpc.RpcError as error:
            self.close()
            raise _classify(error, method) from None
        return bytes(reply)

    def query(self) -> DeviceAllocations:
        """Every allocatable and every assigned device ID; raises `PodResourcesError`."""
        check_socket(self.socket_path)
        allocatable = self._call(ALLOCATABLE_METHOD)
        listed = self._call(LIST_METHOD)
        try:
            groups = decode_allocatable_response(allocatable)
            containers = decode_list_response(listed)
        except WireError as error:
            raise PodResourcesError("bad-response", f"undecodable answer: {error}") from None
        by_pod: dict[str, set[str]] = {}
        for container in containers:
            ids = {i for g in container.devices for i in g.device_ids}
            if ids:
                ref = pod_ref(container.pod_namespace, container.pod_name)
                by_pod.setdefault(ref, set()).update(ids)
        return DeviceAllocations(
            allocatable_ids=frozenset(i for g in groups for i in g.device_ids),
            assigned_ids=frozenset(i for ids in by_pod.values() for i in ids),
            pods=tuple(PodDevices(ref, frozenset(ids)) for ref, ids in sorted(by_pod.items())),
        )

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
