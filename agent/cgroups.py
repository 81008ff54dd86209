"""Whose a GPU process is: its pod, from the cgroup the kubelet put it in.

NVML names the processes on a GPU by PID; the kubelet's pod-resources API names pods by namespace
and name. Between them stands the process's cgroup: the kubelet places every container of a pod
under a cgroup named after the pod's UID, so `/proc/<pid>/cgroup` says which pod a process is in,
whatever the node's setup:

    cgroupfs driver:  0::/kubepods/burstable/pod7e1c...-...-.../0123abcd...
    systemd driver:   0::/kubepods.slice/kubepods-burstable.slice/
                          kubepods-burstable-pod7e1c..._..._....slice/cri-containerd-0123abcd.scope
    cgroup v1:        the same paths after `<id>:<controllers>:`, one line per hierarchy
    a private cgroup namespace: the same, relative to the reader's own cgroup (`/../..`)

Guaranteed pods sit directly under `kubepods`; the systemd driver writes the UID's `-` as `_`;
static pods' UIDs are 32 hex digits without dashes (the kubelet's hash of their manifest).
The pod's UID then names the pod through the API server (`agent.kube.pods_on_node`): neither the
cgroup nor the kubelet's pod-resources API carries both.

`pod_uid` is pure (text in, UID out); `OwnerResolver` does the reads through the callables it is
given, so tests drive it with files and a fake API. Every failure is an outcome, never an error:
`vanished` (the process exited between NVML's list and the read), `unreadable` (permission, I/O),
`no-pod` (a process outside any pod, e.g. on the host), `unnamed` (a UID the API did not name).
"""

from __future__ import annotations

import errno
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

from agent.records import ProcessOwner

log = logging.getLogger(__name__)

# `pod<uid>` as a path segment or the tail of a systemd slice name (`kubepods-besteffort-pod...`).
_POD_SEGMENT: Final = re.compile(
    r"(?:^|[/-])pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32}"
    r")(?:\.slice)?(?=/|$)"
)
VANISHED: Final = "vanished"
UNREADABLE: Final = "unreadable"
NO_POD: Final = "no-pod"
UNNAMED: Final = "unnamed"
FOUND: Final = "pod"


def pod_uid(cgroup_text: str) -> str | None:
    """The pod UID in a `/proc/<pid>/cgroup` text (dashed, lowercase), or None (no pod)."""
    for line in cgroup_text.splitlines():
        # `hierarchy-id:controllers:path`; the path itself may hold `:` on odd setups.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for segment_match in _POD_SEGMENT.finditer(parts[2].strip()):
            return segment_match.group(1).replace("_", "-")
    return None


def read_cgroup_file(proc_root: str, pid: int) -> str:
    """`<proc_root>/<pid>/cgroup`; raises OSError (ENOENT/ESRCH when the process is gone)."""
    return (Path(proc_root) / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")


class OwnerResolver:
    """Maps GPU processes to pods, keeping the pod names the API server gave until a refresh.

    `read_cgroup(pid)` returns the cgroup text or raises OSError; `list_pods()` returns pod UID ->
    `namespace/name` for the pods of this node, or raises. The list is asked for only when a
    process's UID is not known yet, and at most once per `refresh_min_s`: a pod's UID never
    changes its name, and a new pod that is not named yet gets `unnamed` (its figures `-`) for
    at most that long.
    """

    def __init__(
        self,
        *,
        read_cgroup: Callable[[int], str],
        list_pods: Callable[[], Mapping[str, str]],
        refresh_min_s: float = 30.0,
    ) -> None:
        self._read_cgroup = read_cgroup
        self._list_pods = list_pods
        self.refresh_min_s = refresh_min_s
        self._names: dict[str, str] = {}
        self._listed_s = -math.inf
        self.list_failures = 0

    def _name(self, uid: str, now_s: float) -> str | None:
        name = self._names.get(uid)
        if name is None and now_s - self._listed_s >= self.refresh_min_s:
            self._listed_s = now_s
            try:
                # Replaced whole: the list is this node's pods now, so ended pods drop out.
                self._names = dict(self._list_pods())
            except Exception as error:
                self.list_failures += 1
                log.warning("could not list this node's pods to name GPU processes: %s", error)
            name = self._names.get(uid)
        return name

    def owner(self, pid: int, *, now_s: float) -> ProcessOwner:
        try:
            text = self._read_cgroup(pid)
        except OSError as error:
            gone = isinstance(error, FileNotFoundError | ProcessLookupError) or (
                error.errno in (errno.ENOENT, errno.ESRCH)
            )
            return ProcessOwner(None, VANISHED if gone else UNREADABLE)
        uid = pod_uid(text)
        if uid is None:
            return ProcessOwner(None, NO_POD)
        name = self._name(uid, now_s)
        return ProcessOwner(None, UNNAMED) if name is None else ProcessOwner(name, FOUND)

    def resolve(self, pids: Iterable[int], *, now_s: float) -> dict[int, ProcessOwner]:
        return {pid: self.owner(pid, now_s=now_s) for pid in sorted(set(pids))}
