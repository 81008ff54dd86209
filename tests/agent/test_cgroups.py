"""GPU processes to pods: the pod UID in every cgroup layout, and each way a lookup can fail."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path

import pytest

from agent.cgroups import OwnerResolver, pod_uid, read_cgroup_file
from agent.kube import pods_by_uid
from agent.records import ProcessOwner

UID = "7e1c3a52-9b0d-4f6e-8a21-3c5d7e9f1b24"
SYSTEMD_UID = UID.replace("-", "_")
STATIC = "6f1e4e8c0a9b4d2e8f7a6b5c4d3e2f1a"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}"
            ".slice/cri-containerd-0123abcd.scope\n",
            UID,
            id="v2-systemd-burstable",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-0123abcd.scope\n",
            UID,
            id="v2-systemd-guaranteed",
        ),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/0123abcd\n", UID, id="v2-cgroupfs"),
        pytest.param(f"0::/kubepods/pod{UID}/0123abcd\n", UID, id="v2-cgroupfs-guaranteed"),
        pytest.param(
            "12:memory:/kubepods/burstable/pod" + UID + "/0123abcd\n"
            "11:cpu,cpuacct:/kubepods/burstable/pod" + UID + "/0123abcd\n"
            "1:name=systemd:/kubepods/burstable/pod" + UID + "/0123abcd\n",
            UID,
            id="v1-cgroupfs",
        ),
        pytest.param(
            "13:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            + SYSTEMD_UID
            + ".slice/docker-0123abcd.scope\n",
            UID,
            id="v1-systemd-docker",
        ),
        pytest.param(
            f"0::/../../kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-1.scope\n",
            UID,
            id="private-cgroup-namespace",
        ),
        pytest.param(f"0::/kubepods/burstable/pod{STATIC}/0123abcd\n", STATIC, id="static-pod"),
        pytest.param(f"0::/kubepods/burstable/pod{UID.upper()}/x\n", None, id="uppercase-no"),
        pytest.param("0::/system.slice/nvidia-persistenced.service\n", None, id="host-service"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="user-session"),
        pytest.param("0::/kubepods/burstable/podnot-a-uid/x\n", None, id="not-a-uid"),
        pytest.param(f"0::/mypod{UID}/x\n", None, id="pod-inside-another-word"),
        pytest.param("", None, id="empty"),
        pytest.param("garbage without colons\n", None, id="garbage"),
    ],
)
def test_pod_uid(text: str, expected: str | None) -> None:
    assert pod_uid(text) == expected


class FakeApi:
    def __init__(self, pods: Mapping[str, str] | None = None, *, fail: bool = False) -> None:
        self.pods = dict(pods or {})
        self.fail = fail
        self.calls = 0

    def __call__(self) -> Mapping[str, str]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("API down")
        return self.pods


def _proc(tmp_path: Path, cgroups: Mapping[int, str]) -> str:
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def _reader(root: str, errors: Mapping[int, OSError]):  # type: ignore[no-untyped-def]
    def read(pid: int) -> str:
        if pid in errors:
            raise errors[pid]
        return read_cgroup_file(root, pid)

    return read


def test_each_outcome(tmp_path: Path) -> None:
    other = "0f0f0f0f-0000-4000-8000-000000000000"
    root = _proc(
        tmp_path,
        {
            10: f"0::/kubepods/burstable/pod{UID}/abc\n",
            11: "0::/system.slice/foo.service\n",
            12: f"0::/kubepods/burstable/pod{other}/abc\n",
        },
    )
    errors = {13: PermissionError(errno.EACCES, "denied"), 14: ProcessLookupError(errno.ESRCH, "")}
    resolver = OwnerResolver(
        read_cgroup=_reader(root, errors), list_pods=FakeApi({UID: "ml/infer-a"})
    )
    assert resolver.resolve([10, 11, 12, 13, 14, 99], now_s=0.0) == {
        10: ProcessOwner("ml/infer-a", "pod"),
        11: ProcessOwner(None, "no-pod"),
        12: ProcessOwner(None, "unnamed"),
        13: ProcessOwner(None, "unreadable"),
        14: ProcessOwner(None, "vanished"),
        99: ProcessOwner(None, "vanished"),  # no /proc entry at all
    }


def test_pods_are_listed_only_for_an_unknown_uid_and_at_most_every_refresh(tmp_path: Path) -> None:
    root = _proc(tmp_path, {10: f"0::/kubepods/pod{UID}/a\n"})
    api = FakeApi({})
    resolver = OwnerResolver(
        read_cgroup=lambda pid: read_cgroup_file(root, pid), list_pods=api, refresh_min_s=30.0
    )
    assert resolver.owner(10, now_s=0.0).outcome == "unnamed"
    assert resolver.owner(10, now_s=10.0).outcome == "unnamed"
    assert api.calls == 1  # within the refresh interval: not asked again
    api.pods = {UID: "ml/infer-a"}
    assert resolver.owner(10, now_s=30.0) == ProcessOwner("ml/infer-a", "pod")
    assert resolver.owner(10, now_s=100.0).pod == "ml/infer-a"
    assert api.calls == 2  # known now: no more lists


def test_a_failing_list_leaves_the_pod_unnamed(tmp_path: Path) -> None:
    root = _proc(tmp_path, {10: f"0::/kubepods/pod{UID}/a\n"})
    resolver = OwnerResolver(
        read_cgroup=lambda pid: read_cgroup_file(root, pid), list_pods=FakeApi(fail=True)
    )
    assert resolver.owner(10, now_s=0.0) == ProcessOwner(None, "unnamed")
    assert resolver.list_failures == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {
                "kind": "PartialObjectMetadataList",
                "items": [
                    {"metadata": {"namespace": "ml", "name": "infer-a", "uid": UID}},
                    {
                        "metadata": {
                            "namespace": "kube-system",
                            "name": "etcd-node-1",
                            "uid": "11111111-2222-3333-4444-555555555555",
                            "annotations": {"kubernetes.io/config.mirror": STATIC},
                        }
                    },
                ],
            },
            {
                UID: "ml/infer-a",
                "11111111-2222-3333-4444-555555555555": "kube-system/etcd-node-1",
                STATIC: "kube-system/etcd-node-1",
            },
            id="pods-and-a-mirror-pod",
        ),
        pytest.param(
            {"items": [{"metadata": {"name": "x", "uid": UID}}, "junk", {"metadata": None}]},
            {},
            id="malformed-items-skipped",
        ),
        pytest.param({"kind": "Status"}, {}, id="no-items"),
        pytest.param([], {}, id="not-an-object"),
    ],
)
def test_pods_by_uid(body: object, expected: dict[str, str]) -> None:
    assert pods_by_uid(body) == expected
