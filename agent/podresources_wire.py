"""The protobuf wire format of the few pod-resources messages the agent reads, by hand.

The agent needs two replies of the kubelet's pod-resources API (`agent/podresources_v1.proto`):
the devices assigned to each container (`List`) and the devices the kubelet can assign
(`GetAllocatableResources`). Decoding them takes four message types and two wire types, so this
module does it directly instead of loading the protobuf runtime into a daemon with a memory
budget. Pure: bytes in, records out. Like any protobuf reader it skips fields it does not know,
so newer kubelets that add fields stay readable; a truncated or malformed message raises
`WireError`. The encoder is the inverse, for stand-ins and tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

_VARINT: Final = 0
_FIXED64: Final = 1
_LEN: Final = 2
_FIXED32: Final = 5
_MAX_VARINT_BYTES: Final = 10


class WireError(ValueError):
    """The bytes are not a valid encoding of the expected message."""


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """`ContainerDevices`: devices of one resource (`nvidia.com/gpu`, ...), by device ID."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """The devices assigned to one container of one pod."""

    pod_namespace: str
    pod_name: str
    container_name: str
    devices: tuple[DeviceGroup, ...]


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 7 * _MAX_VARINT_BYTES, 7):
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise WireError("varint longer than 10 bytes")


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value): an int for scalars, the bytes of a length-delimited one."""
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 0x7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == _VARINT:
            value, pos = _varint(data, pos)
            yield number, wire_type, value
        elif wire_type == _LEN:
            length, pos = _varint(data, pos)
            if length > end - pos:
                raise WireError(f"field {number} runs past the end of the message")
            yield number, wire_type, data[pos : pos + length]
            pos += length
        elif wire_type in (_FIXED64, _FIXED32):
            size = 8 if wire_type == _FIXED64 else 4
            if size > end - pos:
                raise WireError(f"field {number} runs past the end of the message")
            yield number, wire_type, int.from_bytes(data[pos : pos + size], "little")
            pos += size
        else:
            # 3 and 4 are proto2 groups, which proto3 messages never contain; 6 and 7 do not exist.
            raise WireError(f"unsupported wire type {wire_type} (field {number})")


def _embedded(number: int, wire_type: int, value: int | memoryview) -> memoryview:
    if wire_type != _LEN or isinstance(value, int):
        raise WireError(f"field {number} should be length-delimited, has wire type {wire_type}")
    return value


def _text(number: int, wire_type: int, value: int | memoryview) -> str:
    try:
        return bytes(_embedded(number, wire_type, value)).decode("utf-8")
    except UnicodeDecodeError as error:
        raise WireError(f"field {number} is not UTF-8") from error


def _device_group(data: memoryview) -> DeviceGroup:
    resource_name = ""
    device_ids: list[str] = []
    for number, wire_type, value in _fields(data):
        if number == 1:
            resource_name = _text(number, wire_type, value)
        elif number == 2:
            device_ids.append(_text(number, wire_type, value))
    return DeviceGroup(resource_name, tuple(device_ids))


def _container(data: memoryview, namespace: str, pod: str) -> ContainerDevices:
    name = ""
    groups: list[DeviceGroup] = []
    for number, wire_type, value in _fields(data):
        if number == 1:
            name = _text(number, wire_type, value)
        elif number == 2:
            groups.append(_device_group(_embedded(number, wire_type, value)))
    return ContainerDevices(namespace, pod, name, tuple(groups))


def _pod(data: memoryview) -> list[ContainerDevices]:
    # The containers may come before the pod's name on the wire: collect, then label.
    name = namespace = ""
    containers: list[memoryview] = []
    for number, wire_type, value in _fields(data):
        if number == 1:
            name = _text(number, wire_type, value)
        elif number == 2:
            namespace = _text(number, wire_type, value)
        elif number == 3:
            containers.append(_embedded(number, wire_type, value))
    return [_container(c, namespace, name) for c in containers]


def decode_list_response(data: bytes) -> tuple[ContainerDevices, ...]:
    """`ListPodResourcesResponse` -> one record per container (containers without devices too)."""
    found: list[ContainerDevices] = []
    for number, wire_type, value in _fields(memoryview(data)):
        if number == 1:
            found.extend(_pod(_embedded(number, wire_type, value)))
    return tuple(found)


def decode_allocatable_response(data: bytes) -> tuple[DeviceGroup, ...]:
    """`AllocatableResourcesResponse` -> its device groups."""
    return tuple(
        _device_group(_embedded(number, wire_type, value))
        for number, wire_type, value in _fields(memoryview(data))
        if number == 1
    )


# ---------------------------------------------------------------------------------- encoding


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _text_field(number: int, text: str) -> bytes:
    # proto3 leaves a field at its default (the empty string) off the wire.
    return _len_field(number, text.encode()) if text else b""


def _encode_group(group: DeviceGroup) -> bytes:
    return _text_field(1, group.resource_name) + b"".join(
        _len_field(2, device_id.encode()) for device_id in group.device_ids
    )


def encode_list_response(containers: Sequence[ContainerDevices]) -> bytes:
    """The inverse of `decode_list_response`; consecutive containers of one pod share its entry."""
    pods: list[tuple[str, str, list[ContainerDevices]]] = []
    for container in containers:
        if pods and pods[-1][:2] == (container.pod_namespace, container.pod_name):
            pods[-1][2].append(container)
        else:
            pods.append((container.pod_namespace, container.pod_name, [container]))
    out = bytearray()
    for namespace, name, members in pods:
        body = _text_field(1, name) + _text_field(2, namespace)
        for member in members:
            container_body = _text_field(1, member.container_name) + b"".join(
                _len_field(2, _encode_group(g)) for g in member.devices
            )
            body += _len_field(3, container_body)
        out += _len_field(1, body)
    return bytes(out)


def encode_allocatable_response(groups: Sequence[DeviceGroup]) -> bytes:
    """The inverse of `decode_allocatable_response`."""
    return b"".join(_len_field(1, _encode_group(g)) for g in groups)
