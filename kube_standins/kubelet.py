"""A stand-in for the kubelet's pod-resources gRPC API, served on a unix socket by real grpc.

It answers `v1.PodResourcesLister/List` and `/GetAllocatableResources` with bytes it is given (or
encodes records with the agent's own codec), so the agent's client meets a real gRPC server in the
tests, the benchmarks and local runs, as it meets the kubelet on a node. Methods can be left out
(an old kubelet answers UNIMPLEMENTED), slowed down (a hung kubelet) or made to answer garbage.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Final

import grpc

from agent.podresources_wire import (
    ContainerDevices,
    DeviceGroup,
    encode_allocatable_response,
    encode_list_response,
)

SERVICE: Final = "v1.PodResourcesLister"
LIST: Final = "List"
ALLOCATABLE: Final = "GetAllocatableResources"


class PodResourcesStandIn:
    """`with PodResourcesStandIn(path) as kubelet: kubelet.serve(...)`; thread-safe."""

    def __init__(
        self, socket_path: str | Path, *, methods: Sequence[str] = (LIST, ALLOCATABLE)
    ) -> None:
        self.socket_path = str(socket_path)
        self._lock = threading.Lock()
        self._responses: dict[str, bytes] = {LIST: b"", ALLOCATABLE: b""}
        self.delay_s = 0.0
        self.calls: Counter[str] = Counter()
        handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
            name: grpc.unary_unary_rpc_method_handler(self._behaviour(name)) for name in methods
        }
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self._server.add_insecure_port(f"unix:{self.socket_path}")

    def _behaviour(self, name: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def answer(_request: bytes, _context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls[name] += 1
                delay_s = self.delay_s
                response = self._responses[name]
            if delay_s:
                time.sleep(delay_s)
            return response

        return answer

    def serve(
        self, *, allocatable: Sequence[DeviceGroup], containers: Sequence[ContainerDevices]
    ) -> None:
        """Answer with these records from now on."""
        self.serve_bytes(
            allocatable=encode_allocatable_response(allocatable),
            listed=encode_list_response(containers),
        )

    def serve_bytes(self, *, allocatable: bytes, listed: bytes) -> None:
        """Answer with these encoded messages (or garbage) from now on."""
        with self._lock:
            self._responses = {ALLOCATABLE: allocatable, LIST: listed}

    def start(self) -> PodResourcesStandIn:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> PodResourcesStandIn:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
