"""The product's image, built with buildah from the Dockerfile, and its binaries run from it.

`build` makes the image with Debian's `buildah` (`--isolation chroot`, the `vfs` storage driver,
no daemon) into a store of the checkout's own under `.tools/containers`. Where the official
Python base cannot be pulled, a base that `mmdebstrap` makes from Debian bookworm's `python3`
packages stands in for it through the Dockerfile's `PYTHON_IMAGE` argument. Both are cached by
their inputs: the base by its recipe and the package sources, the image by the base, the
Dockerfile and every file the build context sends, so an unchanged checkout builds nothing.
`report` prints the image's size over its base and its largest installed distributions.

`run_in_image` starts one of the image's binaries as a kubelet would start the container: as the
given user, with only the given environment on top of the image's, on a read-only root with an
empty `/tmp`, and with the service-account files where the Kubernetes client looks for them. It
uses a mount namespace and `chroot` (root only), so the process it starts is the binary itself:
a signal sent to it reaches the binary, and its exit code is the binary's.

    python -m loopback_cluster.image build [--python-image IMAGE]   (or: python3 dev.py image)
    python -m loopback_cluster.image report
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
TOOLS: Final = ROOT / ".tools"
STORE: Final = TOOLS / "containers"
STATE: Final = TOOLS / "image" / "built.json"
IMAGE_NAME: Final = "localhost/gpu-live-scheduler"
BASE_NAME: Final = "localhost/gpu-live-scheduler-base"
# The interpreter's minor version: docker/constraints.txt is generated on it and the official
# default base (python:3.11-slim-bookworm) carries it; bookworm's python3 is 3.11 too.
SUITE: Final = "bookworm"
# What the stand-in base holds: the interpreter, the `python` and `pip` commands the Dockerfile
# calls (Debian's pip, with its setuptools and wheel), and the CA certificates pip needs.
BASE_PACKAGES: Final = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
# As the official slim images do, without documentation, manual pages and translations.
BASE_DPKG_OPTIONS: Final = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
BASE_ENV: Final = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
# The host's package sources, so the base comes from the same Debian archive as the host's own.
SOURCES: Final = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
# The host's CA bundle, mounted into the build so that pip trusts what the host trusts.
CA_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
VENV: Final = PurePosixPath("/opt/gpu-live-scheduler")
# The user and group the image runs its binaries as (the Dockerfile's USER), which the chart's
# securityContext names too.
IMAGE_USER: Final = 65532
SERVICE_ACCOUNT_DIR: Final = PurePosixPath("/var/run/secrets/kubernetes.io/serviceaccount")


class ImageError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- buildah


def buildah(*args: str, capture: bool = True, check: bool = True) -> str:
    """Run buildah on the checkout's own store (vfs: plain directories, no kernel overlay)."""
    argv = [
        "buildah",
        f"--root={STORE / 'storage'}",
        f"--runroot={STORE / 'run'}",
        "--storage-driver=vfs",
        *args,
    ]
    done = subprocess.run(
        argv, capture_output=capture, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if check and done.returncode != 0:
        detail = (done.stderr or "").strip()[-2000:] if capture else ""
        raise ImageError(f"buildah {' '.join(args[:2])} failed (exit {done.returncode}) {detail}")
    return done.stdout if capture else ""


def image_exists(name: str) -> bool:
    done = subprocess.run(
        [
            "buildah",
            f"--root={STORE / 'storage'}",
            f"--runroot={STORE / 'run'}",
            "--storage-driver=vfs",
            "inspect",
            "--type=image",
            name,
        ],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def inspect(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(buildah("inspect", "--type=image", name))
    return found


def missing_tools_reason(*, base: bool = True) -> str | None:
    """Why the image cannot be built or run here, or None when it can."""
    tools = ("buildah", "mmdebstrap") if base else ("buildah",)
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not found: `python3 dev.py tools` installs Debian's "
            f"package{'s' if len(missing) > 1 else ''} (as root)"
        )
    if os.geteuid() != 0:
        return "building and running the image needs root (buildah and chroot without a daemon)"
    return None


# ----------------------------------------------------------------------------- inputs


def _sources() -> Path:
    for path in SOURCES:
        if path.is_file():
            return path
    raise ImageError(f"no Debian package sources found ({', '.join(map(str, SOURCES))})")


def _digest(parts: Sequence[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:12]


def base_key() -> str:
    """The stand-in base's inputs: its recipe and the package sources it is made from."""
    recipe = {
        "suite": SUITE,
        "variant": "apt",
        "packages": BASE_PACKAGES,
        "dpkg": BASE_DPKG_OPTIONS,
        "env": BASE_ENV,
    }
    return _digest([json.dumps(recipe, sort_keys=True).encode(), _sources().read_bytes()])


def base_image() -> str:
    return f"{BASE_NAME}:python3-{SUITE}-{base_key()}"


def context_files() -> list[Path]:
    """Every file the build context sends, read from .dockerignore as the Dockerfile's build
    sees it: `*` first, then the `!path` lines let paths back in, `**/` patterns leave out."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    if not rules or rules[0] != "*":
        raise ImageError(".dockerignore must start with '*' (send only what is listed)")
    included = [ln[1:].rstrip("/") for ln in rules if ln.startswith("!")]
    left_out = [ln.removeprefix("**/") for ln in rules if ln.startswith("**/")]
    files: list[Path] = []
    for name in included:
        path = ROOT / name
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        for candidate in candidates:
            relative = candidate.relative_to(ROOT)
            if candidate.is_file() and not any(
                relative.match(pattern) or any(part == pattern for part in relative.parts)
                for pattern in left_out
            ):
                files.append(candidate)
    return files


def image_key(python_image: str | None = None) -> str:
    """The image's inputs: its base, the Dockerfile and each file of the context."""
    base = python_image or base_image()
    parts = [base.encode(), (ROOT / "Dockerfile").read_bytes()]
    for path in context_files():
        parts += [str(path.relative_to(ROOT)).encode(), path.read_bytes()]
    return _digest(parts)


def image_name(python_image: str | None = None) -> str:
    return f"{IMAGE_NAME}:{image_key(python_image)}"


# ----------------------------------------------------------------------------- building


def build_base(*, out: Any = sys.stderr) -> str:
    """The stand-in base in the store (made once per set of inputs); its name."""
    name = base_image()
    if image_exists(name):
        return name
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap not found: `python3 dev.py tools` installs it (as root)")
    (TOOLS / "image").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS / "image") as scratch:
        tarball = Path(scratch) / "base.tar"
        print(f"making the Python base {name} with mmdebstrap ...", file=out, flush=True)
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=apt",
                f"--include={','.join(BASE_PACKAGES)}",
                *(f"--dpkgopt={option}" for option in BASE_DPKG_OPTIONS),
                SUITE,
                str(tarball),
                str(_sources()),
            ],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        container = buildah("from", "scratch").strip()
        try:
            buildah("add", container, str(tarball), "/")
            env = [f"--env={pair}" for pair in BASE_ENV]
            buildah("config", *env, "--cmd=python3", container)
            buildah("commit", "--identity-label=false", container, name)
        finally:
            buildah("rm", container, check=False)
    _drop_older(BASE_NAME, keep=name)
    return name


def _drop_older(repository: str, *, keep: str) -> None:
    """Remove the store's other tags of `repository`: vfs keeps every layer as a full copy."""
    for image in json.loads(buildah("images", "--json") or "[]"):
        for tagged in image.get("names") or []:
            if tagged.startswith(repository + ":") and tagged != keep:
                buildah("rmi", tagged, check=False)
    buildah("rmi", "--prune", check=False)


@dataclass(frozen=True)
class Built:
    image: str
    key: str
    python_image: str
    build_s: float

    def write(self) -> None:
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def read(cls) -> Built | None:
        try:
            return cls(**json.loads(STATE.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def build(python_image: str | None = None, *, out: Any = sys.stderr) -> Built:
    """Build the image (the base too, unless `python_image` is given); cached by inputs."""
    started = time.monotonic()
    base = python_image or build_base(out=out)
    name = image_name(python_image)
    if image_exists(name):
        print(f"{name} is up to date", file=out, flush=True)
        built = Built(name, image_key(python_image), base, 0.0)
        built.write()
        return built
    print(f"building {name} on {base} ...", file=out, flush=True)
    argv = [
        "build",
        "--isolation=chroot",
        # The stand-in base exists only in this store; a given one may be pulled.
        "--pull=never" if python_image is None else "--pull=missing",
        "--identity-label=false",
        "--network=host",
        f"--build-arg=PYTHON_IMAGE={base}",
        f"--tag={name}",
        f"--file={ROOT / 'Dockerfile'}",
    ]
    if CA_BUNDLE.is_file():
        argv.append(f"--volume={CA_BUNDLE}:{CA_BUNDLE}:ro")
    buildah(*argv, str(ROOT), capture=False)
    built = Built(name, image_key(python_image), base, round(time.monotonic() - started, 1))
    built.write()
    _drop_older(IMAGE_NAME, keep=name)
    print(f"built {name} in {built.build_s:.0f} s", file=out, flush=True)
    return built


def current() -> tuple[Built | None, str | None]:
    """The image built for this checkout's inputs, or why there is none to use."""
    reason = missing_tools_reason(base=False)
    if reason is not None:
        return None, reason
    built = Built.read()
    if built is None:
        return None, "no image built: run `python3 dev.py image`"
    python_image = None if built.python_image == base_image() else built.python_image
    if built.key != image_key(python_image):
        return None, "the image is older than the checkout: run `python3 dev.py image`"
    if not image_exists(built.image):
        return None, f"{built.image} is not in {STORE}: run `python3 dev.py image`"
    return built, None


# ----------------------------------------------------------------------------- its contents


@dataclass(frozen=True, slots=True)
class MountedImage:
    """An image (`name`) with its root filesystem mounted at `rootfs` (`mounted_current`)."""

    name: str
    rootfs: Path

    def argv(self, container: Container) -> list[str]:
        """The command line that runs `container` from this image (`container_argv`)."""
        return container_argv(self.rootfs, container, image=self.name)


@contextlib.contextmanager
def mounted_current() -> Iterator[MountedImage]:
    """The image built from this checkout, mounted while in use (root and buildah); an
    `ImageError` says why there is none to use."""
    built, reason = current()
    if built is None:
        raise ImageError(reason)
    with mounted(built.image) as rootfs:
        yield MountedImage(built.image, rootfs)


@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    """The image's root filesystem, as a working container's (changes there are thrown away)."""
    container = buildah("from", "--pull=never", image).strip()
    try:
        yield Path(buildah("mount", container).strip())
    finally:
        buildah("umount", container, check=False)
        buildah("rm", container, check=False)


def site_packages(rootfs: Path) -> Path:
    (found,) = (rootfs / VENV.relative_to("/") / "lib").glob("python3.*/site-packages")
    return found


def _du(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    bytes_on_disk: int


def distributions(rootfs: Path) -> list[Distribution]:
    """Every distribution in the image's environment with what its files take on disk (the
    files its RECORD lists, their directories whole, so compiled bytecode counts too)."""
    site = site_packages(rootfs)
    found: list[Distribution] = []
    for info in sorted(site.glob("*.dist-info")):
        meta = email.parser.HeaderParser().parsestr((info / "METADATA").read_text())
        tops: set[str] = set()
        with (info / "RECORD").open(newline="") as record:
            for row in csv.reader(record):
                top = PurePosixPath(row[0]).parts[0] if row and row[0] else ""
                if top not in ("", "..", "__pycache__") and not top.endswith(".dist-info"):
                    tops.add(top.removesuffix(".py") if top.endswith(".py") else top)
        size = _du(info)
        for top in sorted(tops):
            for entry in (site / top, site / f"{top}.py"):
                if entry.exists():
                    size += _du(entry)
            size += sum(p.stat().st_size for p in (site / "__pycache__").glob(f"{top}.*.pyc"))
        found.append(Distribution(meta["Name"], meta["Version"], size))
    return found


def layers_over_base(image: str, base: str) -> int:
    """Bytes of the image's layers that its base does not have (uncompressed tar sizes)."""
    base_layers = {layer["digest"] for layer in json.loads(inspect(base)["Manifest"])["layers"]}
    layers = json.loads(inspect(image)["Manifest"])["layers"]
    return sum(int(layer["size"]) for layer in layers if layer["digest"] not in base_layers)


def report(built: Built, *, top: int = 12, out: Any = sys.stdout) -> None:
    mb = 1_000_000
    over = layers_over_base(built.image, built.python_image)
    base_size = sum(
        int(layer["size"])
        for layer in json.loads(inspect(built.python_image)["Manifest"])["layers"]
    )
    with mounted(built.image) as rootfs:
        found = sorted(distributions(rootfs), key=lambda d: -d.bytes_on_disk)
        venv = _du(rootfs / VENV.relative_to("/"))
    print(f"image {built.image}: {over / mb:.1f} MB over its base", file=out)
    print(f"base {built.python_image}: {base_size / mb:.1f} MB", file=out)
    print(f"{VENV}: {venv / mb:.1f} MB, {len(found)} distributions", file=out)
    print("\n| distribution | version | MB |\n| --- | --- | ---: |", file=out)
    for dist in found[:top]:
        print(f"| {dist.name} | {dist.version} | {dist.bytes_on_disk / mb:.1f} |", file=out)
    rest = sum(d.bytes_on_disk for d in found[top:])
    print(f"| {len(found) - top} others | | {rest / mb:.1f} |", file=out)


# ----------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Container:
    """What a kubelet would make of a pod's container, as far as these binaries can tell."""

    argv: Sequence[str]
    uid: int
    gid: int
    env: Mapping[str, str] = field(default_factory=dict)
    # host path -> path in the container, mounted read-only (ConfigMaps, Secrets, tokens).
    read_only: Mapping[Path, PurePosixPath] = field(default_factory=dict)
    # host path -> path in the container, mounted writable (a benchmark's scratch folder).
    read_write: Mapping[Path, PurePosixPath] = field(default_factory=dict)
    # path in the container -> an empty writable directory (emptyDir).
    empty_dirs: Sequence[PurePosixPath] = (PurePosixPath("/tmp"),)
    read_only_root: bool = True


def image_env(image: str) -> dict[str, str]:
    pairs = inspect(image)["OCIv1"]["config"].get("Env") or []
    return dict(pair.partition("=")[::2] for pair in pairs)


def _inside(rootfs: Path, path: PurePosixPath) -> Path:
    """`path` of the container as a host path, its symlinks resolved within the rootfs (the
    base's /var/run is a link to /run, which must not lead to the host's /run)."""
    resolved = PurePosixPath("/")
    pending = list(path.relative_to("/").parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        candidate = rootfs / (resolved / part).relative_to("/")
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise ImageError(f"too many links under {path}")
            target = PurePosixPath(os.readlink(candidate))
            base = PurePosixPath("/") if target.is_absolute() else resolved
            pending = list((base / target).relative_to("/").parts) + pending
            resolved = PurePosixPath("/")
            continue
        resolved = resolved / part
    return rootfs / resolved.relative_to("/")


_SETUP: Final = r"""
set -eu
root=$1; shift
mount --make-rprivate /
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755,size=1m tmpfs "$root/dev"
for device in null zero full random urandom tty; do
    touch "$root/dev/$device"
    mount --bind "/dev/$device" "$root/dev/$device"
done
while [ "$1" != "--" ]; do
    kind=$1 target=$2; shift 2
    mkdir -p "$target"
    case $kind in
        empty) mount -t tmpfs -o mode=1777,size=64m tmpfs "$target" ;;
        rw:*) mount --bind "${kind#rw:}" "$target" ;;
        *) mount --bind "$kind" "$target"; mount -o remount,bind,ro "$target" ;;
    esac
done
shift
if [ "$1" = ro ]; then mount -o remount,bind,ro "$root"; fi
shift
exec chroot "$@"
"""


def container_argv(rootfs: Path, container: Container, *, image: str) -> list[str]:
    """The command line that runs `container` from the mounted `rootfs`: the process it starts
    is the container's own after a chain of execs (unshare, sh, chroot, env)."""
    # The empty directories first, so that a folder mounted inside one (under /tmp) shows.
    mounts: list[str] = []
    for target in container.empty_dirs:
        mounts += ["empty", str(_inside(rootfs, target))]
    for host, target in container.read_only.items():
        mounts += [str(host), str(_inside(rootfs, target))]
    for host, target in container.read_write.items():
        mounts += [f"rw:{host}", str(_inside(rootfs, target))]
    env = {**image_env(image), **container.env}
    return [
        "unshare",
        "--mount",
        "--",
        "sh",
        "-c",
        _SETUP,
        "container-setup",
        str(rootfs),
        *mounts,
        "--",
        "ro" if container.read_only_root else "rw",
        f"--userspec={container.uid}:{container.gid}",
        f"--groups={container.gid}",
        str(rootfs),
        "/usr/bin/env",
        "-i",
        *(f"{key}={value}" for key, value in sorted(env.items())),
        *container.argv,
    ]


# ----------------------------------------------------------------------------- the command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopback_cluster.image")
    commands = parser.add_subparsers(dest="command", required=True)
    building = commands.add_parser("build", help="build the image (and the stand-in base)")
    building.add_argument(
        "--python-image",
        default=os.environ.get("PYTHON_IMAGE") or None,
        help="a Python base to build on instead of the stand-in (the official one, where it "
        "can be pulled); default: $PYTHON_IMAGE, else the stand-in made with mmdebstrap",
    )
    building.add_argument("--report", action="store_true", help="then print `report`")
    commands.add_parser("report", help="the image's size over its base and its largest packages")
    args = parser.parse_args(argv)
    reason = missing_tools_reason(base=args.command == "build" and not args.python_image)
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            print(f"the image cannot be built: {reason}", file=sys.stderr)
            return 1
        print(f"skipping the image: {reason}", file=sys.stderr)
        return 0
    try:
        if args.command == "build":
            built = build(args.python_image)
            if args.report:
                report(built)
            return 0
        found, why = current()
        if found is None:
            print(why, file=sys.stderr)
            return 1
        report(found)
    except (ImageError, subprocess.CalledProcessError) as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
