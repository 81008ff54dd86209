"""The kubelet pod-resources client: its wire codec against real protobuf, and a real gRPC server.

The protobuf classes are generated from the agent's own `agent/podresources_v1.proto` with
grpcio-tools (a development dependency), so the codec is checked against protobuf's encoder and
decoder, not against itself. The server is real grpc on a unix socket (`kube_standins.kubelet`),
answering with bytes those classes serialize, in the shapes a kubelet with the NVIDIA device
plugin sends: whole GPUs, MIG devices, time-slicing replicas, and other resources to ignore.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.allocations import allocated_by_gpu
from agent.attribution import holders
from agent.podresources import PodResourcesClient, PodResourcesError, check_socket
from agent.podresources_wire import (
    ContainerDevices,
    DeviceGroup,
    WireError,
    decode_allocatable_response,
    decode_list_response,
    encode_allocatable_response,
    encode_list_response,
)
from agent.records import GpuReading
from kube_standins.kubelet import LIST, PodResourcesStandIn

PROTO = Path(__file__).parents[2] / "agent" / "podresources_v1.proto"


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """`podresources_v1_pb2`, generated from the repository's .proto for this test module."""
    from grpc_tools import protoc  # noqa: PLC0415  (a development dependency)

    out = tmp_path_factory.mktemp("pb")
    code = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", str(PROTO)])
    assert code == 0
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("podresources_v1_pb2")
    finally:
        sys.path.remove(str(out))
        sys.modules.pop("podresources_v1_pb2", None)


# ---------------------------------------------------------------------- codec against protobuf

_ids = st.lists(st.text(min_size=0, max_size=24), max_size=4)
_groups = st.lists(st.builds(DeviceGroup, st.text(max_size=20), _ids.map(tuple)), max_size=3)
_containers = st.lists(
    st.builds(
        ContainerDevices,
        st.text(max_size=12),
        st.text(max_size=12),
        st.text(max_size=12),
        _groups.map(tuple),
    ),
    max_size=4,
)


def _pb_list(pb: ModuleType, containers: list[ContainerDevices], cpu_ids: list[int]) -> bytes:
    response = pb.ListPodResourcesResponse()
    for c in containers:
        pod = response.pod_resources.add(name=c.pod_name, namespace=c.pod_namespace)
        container = pod.containers.add(name=c.container_name, cpu_ids=cpu_ids)
        for g in c.devices:
            container.devices.add(resource_name=g.resource_name, device_ids=list(g.device_ids))
    return bytes(response.SerializeToString())


@settings(max_examples=150, deadline=None)
@given(_containers, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
def test_list_decodes_what_protobuf_encodes(
    pb: ModuleType, containers: list[ContainerDevices], cpu_ids: list[int]
) -> None:
    # cpu_ids (a packed repeated int64 the agent does not read) must be skipped, not misread.
    assert decode_list_response(_pb_list(pb, containers, cpu_ids)) == tuple(containers)


@settings(max_examples=150, deadline=None)
@given(_containers)
def test_protobuf_decodes_what_the_codec_encodes(
    pb: ModuleType, containers: list[ContainerDevices]
) -> None:
    parsed = pb.ListPodResourcesResponse.FromString(encode_list_response(containers))
    flat = [
        ContainerDevices(
            p.namespace,
            p.name,
            c.name,
            tuple(DeviceGroup(d.resource_name, tuple(d.device_ids)) for d in c.devices),
        )
        for p in parsed.pod_resources
        for c in p.containers
    ]
    assert flat == containers


@settings(max_examples=100, deadline=None)
@given(_groups, st.lists(st.integers(0, 1023), max_size=8))
def test_allocatable_round_trips_through_protobuf(
    pb: ModuleType, groups: list[DeviceGroup], cpu_ids: list[int]
) -> None:
    message = pb.AllocatableResourcesResponse(cpu_ids=cpu_ids)
    for g in groups:
        message.devices.add(resource_name=g.resource_name, device_ids=list(g.device_ids))
    assert decode_allocatable_response(message.SerializeToString()) == tuple(groups)
    again = pb.AllocatableResourcesResponse.FromString(encode_allocatable_response(groups))
    assert [(d.resource_name, tuple(d.device_ids)) for d in again.devices] == [
        (g.resource_name, g.device_ids) for g in groups
    ]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x0a\x05abc", id="length-past-the-end"),
        pytest.param(b"\x0a", id="truncated-length"),
        pytest.param(b"\x08" + b"\xff" * 11, id="varint-too-long"),
        pytest.param(b"\x0b", id="group-wire-type"),
        pytest.param(b"\x02\x00", id="field-number-zero"),
        pytest.param(b"\x08\x01", id="pod-as-a-number"),
        pytest.param(b"\x0a\x04\x0a\x02\xff\xfe", id="name-not-utf8"),
    ],
)
def test_malformed_messages_raise_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_list_response(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decoding_any_bytes_returns_or_raises_wire_error(data: bytes) -> None:
    for decode in (decode_list_response, decode_allocatable_response):
        with contextlib.suppress(WireError):
            decode(data)


# ---------------------------------------------------------------------- a real gRPC server

GPU = [f"GPU-{n:08x}-1111-2222-3333-444444444444" for n in range(4)]
MIG = ["MIG-a0000000-0000-0000-0000-000000000001", "MIG-a0000000-0000-0000-0000-000000000002"]


def _recorded(pb: ModuleType) -> tuple[bytes, bytes]:
    """A node as a kubelet with the NVIDIA device plugin describes it.

    GPU 0 whole, GPU 1 split into two MIG devices, GPU 2 time-sliced into 4 replicas, GPU 3
    whole; CPUs, memory and another plugin's devices beside them.
    """
    allocatable = pb.AllocatableResourcesResponse(cpu_ids=[0, 1, 2, 3])
    allocatable.devices.add(resource_name="nvidia.com/gpu", device_ids=[GPU[0], GPU[3]])
    allocatable.devices.add(resource_name="nvidia.com/mig-3g.40gb", device_ids=MIG)
    allocatable.devices.add(
        resource_name="nvidia.com/gpu.shared", device_ids=[f"{GPU[2]}::{n}" for n in range(4)]
    )
    allocatable.devices.add(resource_name="rdma/hca_shared_devices_a", device_ids=["0", "1"])
    listed = pb.ListPodResourcesResponse()
    trainer = listed.pod_resources.add(name="trainer-0", namespace="ml")
    main = trainer.containers.add(name="main", cpu_ids=[2, 3])
    main.devices.add(resource_name="nvidia.com/gpu", device_ids=[GPU[0]])
    main.devices.add(resource_name="rdma/hca_shared_devices_a", device_ids=["0"])
    trainer.containers.add(name="sidecar")  # no devices at all
    inference = listed.pod_resources.add(name="llm-7f9c", namespace="serving")
    inference.containers.add(name="server").devices.add(
        resource_name="nvidia.com/mig-3g.40gb", device_ids=[MIG[0]]
    )
    for replica in range(4):  # every replica of GPU 2 taken, by four pods
        pod = listed.pod_resources.add(name=f"notebook-{replica}", namespace="lab")
        pod.containers.add(name="jupyter").devices.add(
            resource_name="nvidia.com/gpu.shared", device_ids=[f"{GPU[2]}::{replica}"]
        )
    return allocatable.SerializeToString(), listed.SerializeToString()


def _gpus() -> list[GpuReading]:
    def reading(index: int, migs: tuple[str, ...] = ()) -> GpuReading:
        return GpuReading(
            uuid=GPU[index],
            index=index,
            name="NVIDIA H100 80GB HBM3",
            utilization=0.1,
            memory_total_mib=81559,
            memory_free_mib=80000,
            temperature_c=40,
            mig_device_uuids=migs,
        )

    return [reading(0), reading(1, tuple(MIG)), reading(2), reading(3)]


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    # A unix socket path must stay under ~108 bytes; pytest's tmp paths can be long.
    short = Path("/tmp") / f"gls-kubelet-{os.getpid()}-{id(tmp_path)}.sock"
    yield str(short)
    short.unlink(missing_ok=True)


def test_reads_allocations_of_every_device_shape(pb: ModuleType, socket_path: str) -> None:
    allocatable, listed = _recorded(pb)
    with PodResourcesStandIn(socket_path) as kubelet:
        kubelet.serve_bytes(allocatable=allocatable, listed=listed)
        client = PodResourcesClient(socket_path, timeout_s=2.0)
        try:
            found = client.query()
        finally:
            client.close()
    assert GPU[0] in found.assigned_ids
    assert "0" in found.allocatable_ids  # other plugins' IDs come through; mapping drops them
    # GPU 0: its only share is taken. GPU 1: one of two MIG devices free. GPU 2: all four
    # replicas taken. GPU 3: free.
    assert allocated_by_gpu(_gpus(), found) == {0: True, 1: False, 2: True, 3: False}
    # Who holds what, by pod (the sidecar holds nothing; other resources' IDs stay, unmapped).
    assert {p.pod: p.device_ids for p in found.pods} == {
        "ml/trainer-0": frozenset({GPU[0], "0"}),
        "serving/llm-7f9c": frozenset({MIG[0]}),
        **{f"lab/notebook-{n}": frozenset({f"{GPU[2]}::{n}"}) for n in range(4)},
    }
    assert holders(_gpus(), found) == {
        0: {"ml/trainer-0"},
        1: {"serving/llm-7f9c"},
        2: {f"lab/notebook-{n}" for n in range(4)},
    }


def test_a_replica_left_free_keeps_the_gpu_schedulable(pb: ModuleType, socket_path: str) -> None:
    allocatable, listed_bytes = _recorded(pb)
    listed = pb.ListPodResourcesResponse.FromString(listed_bytes)
    del listed.pod_resources[-1]  # notebook-3 ended: replica ::3 of GPU 2 is free
    with PodResourcesStandIn(socket_path) as kubelet:
        kubelet.serve_bytes(allocatable=allocatable, listed=listed.SerializeToString())
        client = PodResourcesClient(socket_path, timeout_s=2.0)
        found = client.query()
        client.close()
    assert allocated_by_gpu(_gpus(), found)[2] is False


def test_the_channel_is_reused_across_queries(socket_path: str) -> None:
    with PodResourcesStandIn(socket_path) as kubelet:
        kubelet.serve(allocatable=[DeviceGroup("nvidia.com/gpu", (GPU[0],))], containers=[])
        client = PodResourcesClient(socket_path, timeout_s=2.0)
        for _ in range(3):
            assert client.query().allocatable_ids == {GPU[0]}
        client.close()
        assert kubelet.calls[LIST] == 3


def _refusing_socket(path: str) -> None:
    """A socket file nobody listens on: what a stopped kubelet leaves behind."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.close()


def _fault(case: str, socket_path: str, tmp_path: Path) -> tuple[PodResourcesStandIn | None, str]:
    if case == "socket-missing":
        return None, socket_path
    if case == "not-a-socket":
        plain = tmp_path / "kubelet.sock"
        plain.write_text("")
        return None, str(plain)
    if case == "refused":
        _refusing_socket(socket_path)
        return None, socket_path
    if case == "unimplemented-all":
        return PodResourcesStandIn(socket_path, methods=()), socket_path
    if case == "unimplemented-allocatable":  # a kubelet older than GetAllocatableResources
        return PodResourcesStandIn(socket_path, methods=(LIST,)), socket_path
    kubelet = PodResourcesStandIn(socket_path)
    if case == "timeout":
        kubelet.delay_s = 0.6
    if case == "bad-response":
        kubelet.serve_bytes(allocatable=b"\x0a\xff\x01", listed=b"")
    return kubelet, socket_path


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        pytest.param("socket-missing", "socket-missing", id="socket-missing"),
        pytest.param("not-a-socket", "not-a-socket", id="not-a-socket"),
        pytest.param("refused", "refused", id="refused"),
        pytest.param("unimplemented-all", "unimplemented", id="unknown-version"),
        pytest.param("unimplemented-allocatable", "unimplemented", id="old-kubelet"),
        pytest.param("timeout", "timeout", id="timeout"),
        pytest.param("bad-response", "bad-response", id="bad-response"),
    ],
)
def test_each_fault_has_its_reason(
    case: str, reason: str, socket_path: str, tmp_path: Path
) -> None:
    kubelet, path = _fault(case, socket_path, tmp_path)
    client = PodResourcesClient(path, timeout_s=0.2)
    try:
        if kubelet is not None:
            kubelet.start()
        with pytest.raises(PodResourcesError) as raised:
            client.query()
        assert raised.value.reason == reason
        assert str(raised.value)  # a message an operator can act on
    finally:
        client.close()
        if kubelet is not None:
            kubelet.stop()


def test_recovers_when_the_kubelet_comes_back(socket_path: str) -> None:
    client = PodResourcesClient(socket_path, timeout_s=1.0)
    with pytest.raises(PodResourcesError):
        client.query()
    with PodResourcesStandIn(socket_path) as kubelet:
        kubelet.serve(allocatable=[DeviceGroup("nvidia.com/gpu", (GPU[1],))], containers=[])
        assert client.query().allocatable_ids == {GPU[1]}
    client.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to check as another user")
def test_a_non_root_agent_is_refused_by_a_root_socket(socket_path: str) -> None:
    """The kubelet's socket is root's, mode 0755: another uid may not connect to it.

    Checked by the real kernel in a forked child that drops to uid 65534; the child only runs the
    client's socket check, so no grpc state crosses the fork.
    """
    with PodResourcesStandIn(socket_path):
        os.chmod(socket_path, 0o755)
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 3
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                check_socket(socket_path)
                code = 1
            except PodResourcesError as error:
                code = 0 if error.reason == "permission-denied" else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
