"""The built image for the tests: found (skipped locally without it, failed in CI), mounted, and
its binaries started as the chart's pod spec starts them.

`chart_container` reads a rendered workload the way a kubelet does for what these binaries can
tell: the command and arguments, the environment (ConfigMaps named in `envFrom`, then `env`,
downward-API fields from the values given), the user and group (the container's security
context over the pod's), a read-only root, an empty directory for each `emptyDir` mount, and the
service-account files with `KUBERNETES_SERVICE_HOST`/`_PORT` when the pod mounts its token.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from loopback_cluster import image
from loopback_cluster.control_plane import LOOPBACK
from loopback_cluster.workload import BinaryProcess
from tests.deploy.chart_support import Manifest, Rendered, env_of


def require_image() -> image.Built:
    """The image built for this checkout; skip without it locally, fail without it in CI."""
    built, reason = image.current()
    if built is not None:
        return built
    assert reason is not None
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; CI must build and test the image")
    pytest.skip(reason)


@contextlib.contextmanager
def mounted_image() -> Iterator[image.MountedImage]:
    """The image built for this checkout, mounted (`require_image` when there is none)."""
    require_image()
    with image.mounted_current() as found:
        yield found


def image_process(
    mounted: image.MountedImage, container: image.Container, log_path: Path, name: str
) -> BinaryProcess:
    """`container` as a child process run from the mounted image, its output in `log_path`."""
    return BinaryProcess(name=name, argv=mounted.argv(container), log_path=log_path)


def service_account_files(folder: Path, *, token: str, ca_file: Path, namespace: str) -> Path:
    """What the kubelet projects into a pod that mounts its token (readable by any user, as
    the projected volume's default mode 0644 makes them)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    for name, text in (
        ("token", token),
        ("ca.crt", ca_file.read_text()),
        ("namespace", namespace),
    ):
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    return folder


def workload(rendered: Rendered, component: str) -> Manifest:
    (found,) = [
        m
        for m in rendered.manifests
        if m["kind"] in ("Deployment", "DaemonSet")
        and m["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    return found


def chart_container(
    rendered: Rendered,
    component: str,
    *,
    fields: Mapping[str, str] | None = None,
    service_account: Path | None = None,
    api_port: int | None = None,
) -> image.Container:
    """The `component`'s (agent, scorer) one container, as its rendered pod spec runs it."""
    pod = workload(rendered, component)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container, rendered)
    for item in container.get("env", []):
        field_ref = item.get("valueFrom", {}).get("fieldRef")
        if field_ref is not None:
            env[item["name"]] = (fields or {})[field_ref["fieldPath"]]
    context: dict[str, Any] = {**pod.get("securityContext", {})}
    context.update(container.get("securityContext", {}))
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    empty_dirs: list[PurePosixPath] = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            raise ValueError(f"volume {mount['name']} is not an emptyDir: render without it")
        empty_dirs.append(PurePosixPath(mount["mountPath"]))
    read_only: dict[Path, PurePosixPath] = {}
    if pod.get("automountServiceAccountToken", True) and service_account is not None:
        read_only[service_account] = image.SERVICE_ACCOUNT_DIR
        env["KUBERNETES_SERVICE_HOST"] = LOOPBACK
        env["KUBERNETES_SERVICE_PORT"] = str(api_port)
    return image.Container(
        argv=[*container.get("command", []), *container.get("args", [])],
        uid=int(context["runAsUser"]),
        gid=int(context["runAsGroup"]),
        env=env,
        read_only=read_only,
        empty_dirs=tuple(empty_dirs),
        read_only_root=bool(context.get("readOnlyRootFilesystem", False)),
    )
