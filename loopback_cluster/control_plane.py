"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-scheduler v1.37
(or another minor of the version matrix: v1.36).

The binaries are built from their Go modules by `tools/k8s` (the project's own small Go module:
`k8s.io/kubernetes` with every staging module pinned to its published release, and etcd through
its `embed` package) and cached under `.tools/k8s/<versions>-<hash>/bin`, so a second `build` is
free. `tools/k8s/go.mod` pins the default release; each older minor that CI also runs has its own
pins in `tools/k8s/versions/<minor>.mod` (and `.sum`), built with `go build -modfile`, so one
module's Go files build every version. `LOOPBACK_KUBERNETES` (`v1.36`, `1.36` or `v1.36.3`)
chooses the version for everything that starts a control plane (the e2e suite, the benchmarks,
the demo, `dev.py cluster`); `--kubernetes` does it for one command.

`up` generates a PKI (cluster CA, serving certificate, admin and scheduler client certificates,
service-account signing keys, front-proxy CA and client), starts etcd and kube-apiserver with
RBAC and a service-account issuer (pod-bound tokens carry the node-name claim), and creates the
`default` ServiceAccount that pods need (no controller-manager runs). kube-schedulers are
started separately, each with its own KubeSchedulerConfiguration, because an extender is
configured per scheduler process. There is no kubelet: Nodes are created through the API and
pods are bound by the real scheduler, then stay Pending on their node.

Every process is started in its own session with its PID recorded under the state directory,
so `down` stops exactly what `up` started, from any later process.

    python -m loopback_cluster.control_plane build|up|down|status   (or: python3 dev.py cluster ...)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import functools
import hashlib
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
GO_MODULE: Final = ROOT / "tools" / "k8s"
# Where the pins of the minors other than the default live (`<minor>.mod` and `<minor>.sum`).
OLDER_VERSIONS: Final = "versions"
VERSION_ENV: Final = "LOOPBACK_KUBERNETES"
TOOLS_K8S: Final = ROOT / ".tools" / "k8s"
DEFAULT_STATE_DIR: Final = ROOT / ".tools" / "cluster"
BINARIES: Final = ("etcd", "kube-apiserver", "kube-scheduler", "null-extender")
LOOPBACK: Final = "127.0.0.1"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE: Final = "10.96.0.0/16"
FIRST_SERVICE_IP: Final = "10.96.0.1"
DEFAULT_SCHEDULER_NAME: Final = "gpu-scheduler"
GPU_RESOURCE: Final = "nvidia.com/gpu"


class ClusterError(RuntimeError):
    """A control-plane step failed; the message says which and what to do."""


# ----------------------------------------------------------------------------- build


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """What `tools/k8s` builds for one version: its pins and the cache folder they map to."""

    kubernetes_version: str
    etcd_version: str
    source_digest: str  # of the pins (go.mod and go.sum, or a version's pair) and the Go files
    # The pins' file relative to the module (`go.mod`, or `versions/<minor>.mod`).
    modfile: str = "go.mod"

    @classmethod
    def read(cls, module: Path = GO_MODULE, modfile: str = "go.mod") -> BuildSpec:
        mod = module / modfile
        requires: dict[str, str] = {}
        for line in mod.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("v") and "=>" not in line:
                requires[parts[0]] = parts[1]
        try:
            kubernetes, etcd = requires["k8s.io/kubernetes"], requires["go.etcd.io/etcd/server/v3"]
        except KeyError as missing:
            raise ClusterError(f"{mod} does not require {missing}") from None
        digest = hashlib.sha256()
        # The pins are hashed under the names Go reads them as, so the same pins build into the
        # same cache folder from go.mod or from an alternate file.
        sources = [
            ("go.mod", mod),
            ("go.sum", mod.with_suffix(".sum")),
            *((p.relative_to(module).as_posix(), p) for p in sorted(module.rglob("*.go"))),
        ]
        for name, path in sources:
            digest.update(name.encode() + b"\0")
            digest.update(path.read_bytes())
        return cls(kubernetes, etcd, digest.hexdigest()[:12], modfile)

    @classmethod
    def every(cls, module: Path = GO_MODULE) -> list[BuildSpec]:
        """Every version `tools/k8s` pins, the default first, then newest to oldest."""
        older = [
            cls.read(module, f"{OLDER_VERSIONS}/{path.name}")
            for path in (module / OLDER_VERSIONS).glob("*.mod")
        ]
        older.sort(key=lambda spec: _version_key(spec.kubernetes_version), reverse=True)
        return [cls.read(module), *older]

    @classmethod
    def for_version(cls, wanted: str | None = None, module: Path = GO_MODULE) -> BuildSpec:
        """The spec of `wanted` (`v1.36`, `1.36`, `v1.36.3`), else of `$LOOPBACK_KUBERNETES`,
        else the default. A version `tools/k8s` does not pin is an error that lists those it
        does."""
        wanted = wanted or os.environ.get(VERSION_ENV) or None
        specs = cls.every(module)
        if wanted is None:
            return specs[0]
        want = "v" + wanted.strip().removeprefix("v")
        for spec in specs:
            if want in (spec.kubernetes_version, spec.minor):
                return spec
        known = ", ".join(spec.kubernetes_version for spec in specs)
        raise ClusterError(f"no Kubernetes {wanted!r} in {module}: choose one of {known}")

    @property
    def minor(self) -> str:
        """`v1.37` of `v1.37.2`."""
        return ".".join(self.kubernetes_version.split(".")[:2])

    @property
    def release(self) -> tuple[int, ...]:
        """`(1, 37, 2)` of `v1.37.2`: for comparing versions."""
        return _version_key(self.kubernetes_version)

    @property
    def default(self) -> bool:
        return self.modfile == "go.mod"

    @property
    def bin_dir(self) -> Path:
        return (
            TOOLS_K8S
            / f"kubernetes-{self.kubernetes_version}_etcd-{self.etcd_version}_{self.source_digest}"
            / "bin"
        )

    def built(self) -> bool:
        return all((self.bin_dir / name).is_file() for name in BINARIES)

    def ldflags(self) -> str:
        # What the upstream release build stamps, so `/version` and `--version` say v1.37.x.
        major, minor = self.kubernetes_version.lstrip("v").split(".")[:2]
        stamp = "k8s.io/component-base/version"
        return " ".join(
            [
                "-s -w",
                f"-X {stamp}.gitVersion={self.kubernetes_version}",
                f"-X {stamp}.gitMajor={major}",
                f"-X {stamp}.gitMinor={minor}",
                f"-X {stamp}.gitTreeState=clean",
            ]
        )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split(".") if part.isdigit())


def missing_binaries_reason(spec: BuildSpec | None = None) -> str | None:
    """None when the control plane is built; else one line saying how to build it."""
    spec = spec or BuildSpec.for_version()
    if spec.built():
        return None
    option = "" if spec.default else f" --kubernetes {spec.minor}"
    return (
        f"control plane not built (kubernetes {spec.kubernetes_version}, etcd "
        f"{spec.etcd_version}): run `python3 dev.py cluster build{option}`"
    )


def build(spec: BuildSpec | None = None, *, out: Any = sys.stderr) -> Path:
    """Build the three binaries into the version cache (a no-op when already there)."""
    spec = spec or BuildSpec.for_version()
    if spec.built():
        print(f"control plane binaries up to date in {spec.bin_dir}", file=out)
        return spec.bin_dir
    go = shutil.which("go")
    if go is None:
        raise ClusterError("`go` not found: the control plane is built from Go modules")
    staging = spec.bin_dir.with_name("bin.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    print(
        f"building etcd {spec.etcd_version}, kube-apiserver and kube-scheduler "
        f"{spec.kubernetes_version}, and the benchmark's null extender (cold: several "
        "minutes) ...",
        file=out,
        flush=True,
    )
    started = time.monotonic()
    argv = [
        go,
        "build",
        "-trimpath",
        f"-modfile={spec.modfile}",
        "-ldflags",
        spec.ldflags(),
        "-o",
        f"{staging}{os.sep}",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "./cmd/etcd",
        "./cmd/null-extender",
    ]
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-mod=readonly")
    env.setdefault("CGO_ENABLED", "0")
    result = subprocess.run(argv, cwd=GO_MODULE, env=env, check=False)
    if result.returncode != 0:
        raise ClusterError(f"go build failed (exit {result.returncode}); see its output above")
    staging.rename(spec.bin_dir)
    print(f"built in {time.monotonic() - started:.0f} s: {spec.bin_dir}", file=out)
    return spec.bin_dir


# ----------------------------------------------------------------------------- PKI


@dataclass(frozen=True, slots=True)
class Pki:
    """The control plane's certificates and keys, as files under one directory."""

    root: Path

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def ca_cert(self) -> Path:
        return self.path("ca.crt")

    def exists(self) -> bool:
        return all(
            self.path(n).is_file()
            for n in (
                "ca.crt",
                "ca.key",
                "apiserver.crt",
                "apiserver.key",
                "admin.crt",
                "admin.key",
                "scheduler.crt",
                "scheduler.key",
                "sa.key",
                "sa.pub",
                "front-proxy-ca.crt",
                "front-proxy-client.crt",
                "front-proxy-client.key",
            )
        )

    def generate(self) -> Pki:
        """Write a fresh PKI (ECDSA P-256; a year of validity)."""
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

        self.root.mkdir(parents=True, exist_ok=True)
        self._issue("ca", "loopback-cluster-ca", ca=None)
        apiserver_names = (
            LOOPBACK,
            "localhost",
            FIRST_SERVICE_IP,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
        self._issue("apiserver", "kube-apiserver", ca="ca", server_names=apiserver_names)
        self._issue("admin", "loopback-admin", ca="ca", client=True, groups=("system:masters",))
        self._issue("scheduler", "system:kube-scheduler", ca="ca", client=True)
        self._issue("front-proxy-ca", "front-proxy-ca", ca=None)
        self._issue("front-proxy-client", "front-proxy-client", ca="front-proxy-ca", client=True)
        signing = ec.generate_private_key(ec.SECP256R1())
        self._write_key("sa.key", signing)
        self.path("sa.pub").write_bytes(
            signing.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return self

    def issue_serving_cert(self, name: str, server_names: Sequence[str]) -> tuple[Path, Path]:
        """A serving certificate from the cluster CA (for an extender's TLS in tests)."""
        return self._issue(name, server_names[0], ca="ca", server_names=server_names)

    def issue_client_cert(
        self, name: str, common_name: str, *, groups: Sequence[str] = ()
    ) -> tuple[Path, Path]:
        """A client certificate: the API server reads the user from CN and groups from O."""
        return self._issue(name, common_name, ca="ca", client=True, groups=groups)

    def _write_key(self, name: str, key: Any) -> Path:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        target = self.path(name)
        target.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        target.chmod(0o600)
        return target

    def _issue(
        self,
        name: str,
        common_name: str,
        *,
        ca: str | None,
        server_names: Sequence[str] = (),
        client: bool = False,
        groups: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """Write `<name>.crt` and `<name>.key`: signed by the CA files `<ca>.*`, or, with
        `ca=None`, a self-signed CA."""
        from cryptography import x509  # noqa: PLC0415
        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
            ]
        )
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
        )
        if ca is None:
            issuer_name, signer = subject, key
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        else:
            issuer = x509.load_pem_x509_certificate(self.path(f"{ca}.crt").read_bytes())
            loaded = serialization.load_pem_private_key(self.path(f"{ca}.key").read_bytes(), None)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise ClusterError(f"the key of CA {ca} is not an EC key")
            issuer_name, signer = issuer.subject, loaded
            usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
            if server_names:
                usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
                builder = builder.add_extension(
                    x509.SubjectAlternativeName([_general_name(n) for n in server_names]),
                    critical=False,
                )
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.issuer_name(issuer_name).sign(signer, hashes.SHA256())
        cert_path = self.path(f"{name}.crt")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, self._write_key(f"{name}.key", key)


def _general_name(name: str) -> Any:
    from cryptography import x509  # noqa: PLC0415

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    user: str,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig for one user: a client certificate, or a bearer token."""
    credentials: dict[str, str] = {}
    if cert_file is not None and key_file is not None:
        credentials = {"client-certificate": str(cert_file), "client-key": str(key_file)}
    if token is not None:
        credentials["token"] = token
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopback",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "loopback", "user": user}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # JSON is YAML: every kubeconfig reader takes it.
    path.write_text(json.dumps(document, indent=2) + "\n")
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------- REST


class ApiError(ClusterError):
    def __init__(self, status: int, body: bytes, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:500].decode(errors='replace')}")
        self.status = status
        self.body = body


class KubeApi:
    """A small JSON client for the API server over one keep-alive TLS connection.

    For bootstrap, tests and load generation, where the `kubernetes` client's model classes
    would cost more than the requests (a benchmark patches Nodes ~100 times a second).
    Not thread-safe: one per thread.
    """

    def __init__(
        self,
        port: int,
        *,
        ca_file: Path,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self._context = ssl.create_default_context(cafile=str(ca_file))
        if cert_file is not None and key_file is not None:
            self._context.load_cert_chain(str(cert_file), str(key_file))
        self._headers = {"Accept": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._connection: http.client.HTTPSConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def raw(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> tuple[int, bytes]:
        """One request; retried once on a connection the server closed while idle."""
        payload = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if accept is not None:
            headers["Accept"] = accept
        if payload is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = http.client.HTTPSConnection(
                    LOOPBACK, self.port, context=self._context, timeout=self.timeout_s
                )
            try:
                self._connection.request(method, path, body=payload, headers=headers)
                response = self._connection.getresponse()
                return response.status, response.read()
            except (ConnectionError, http.client.HTTPException, ssl.SSLError, OSError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def call(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201),
    ) -> Any:
        status, data = self.raw(method, path, body, content_type=content_type)
        if status not in ok:
            raise ApiError(status, data, f"{method} {path}")
        return json.loads(data) if data else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def create(self, path: str, body: object) -> Any:
        return self.call("POST", path, body)

    def merge_patch(self, path: str, body: object, *, field_manager: str | None = None) -> Any:
        if field_manager:
            path += ("&" if "?" in path else "?") + f"fieldManager={field_manager}"
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")

    def watch(self, path: str, *, timeout_s: float = 600.0) -> Iterator[dict[str, Any]]:
        """The events of a watch (`path` without `watch=1`), on a connection of their own."""
        connection = http.client.HTTPSConnection(
            LOOPBACK, self.port, context=self._context, timeout=timeout_s
        )
        separator = "&" if "?" in path else "?"
        try:
            connection.request("GET", f"{path}{separator}watch=1", headers=self._headers)
            response = connection.getresponse()
            if response.status != 200:
                raise ApiError(response.status, response.read(), f"WATCH {path}")
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            connection.close()

    def delete(self, path: str, *, missing_ok: bool = True) -> None:
        self.call(
            "DELETE",
            path,
            {"gracePeriodSeconds": 0},
            ok=(200, 202, 404) if missing_ok else (200, 202),
        )


# ----------------------------------------------------------------------------- processes


@dataclass(frozen=True, slots=True)
class Ports:
    """Loopback ports. The CLI's defaults sit away from a real cluster's 2379/2380/6443."""

    etcd_client: int = 23790
    etcd_peer: int = 23800
    apiserver: int = 16443

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def check_port_free(port: int, what: str) -> None:
    """Raise a clear error when something already listens on `port` (before starting `what`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers bind (Go sets SO_REUSEADDR): connections of an earlier run still in
        # TIME_WAIT do not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
            probe.listen(1)
        except OSError:
            raise ClusterError(
                f"port {port} on {LOOPBACK}, needed by {what}, is already in use: stop what "
                f"holds it (`ss -ltnp 'sport = :{port}'`) or choose other ports"
            ) from None


def _pid_alive(pid: int, binary: Path | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that exited but was not waited for still answers signal 0: reap it if it is ours,
    # and count a zombie as gone either way.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    if state == "Z":
        return False
    if binary is None:
        return True
    # A recorded PID may have been reused by an unrelated process since.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return binary.name.encode() in cmdline.split(b"\0", 1)[0]


_PR_SET_PDEATHSIG: Final = 1


@functools.cache
def _prctl() -> Any:
    # Resolved in the parent: the child, between fork and exec, only calls it.
    import ctypes  # noqa: PLC0415

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def _die_with_parent() -> None:  # pragma: no cover (runs in the child)
    # Linux: the child gets SIGTERM when the process that started it exits, so a test run that
    # is killed does not leave a control plane behind.
    _prctl()(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(slots=True)
class ManagedProcess:
    name: str
    binary: Path
    argv: list[str]
    log_path: Path
    pid_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, *, tie_to_parent: bool) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        die_with_parent = None
        if tie_to_parent and sys.platform == "linux":
            _prctl()
            die_with_parent = _die_with_parent
        with self.log_path.open("ab") as log_file:
            self.popen = subprocess.Popen(
                [str(self.binary), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (the hook only calls prctl)
            )
        self.pid_path.write_text(f"{self.popen.pid}\n")

    def recorded_pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        pid = self.recorded_pid()
        return pid is not None and _pid_alive(pid, self.binary)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; by the recorded PID when not our child."""
        pid = self.popen.pid if self.popen is not None else self.recorded_pid()
        if pid is not None and (self.popen is not None or _pid_alive(pid, self.binary)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self._running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while self._running(pid):
                    time.sleep(0.05)
        self.popen = None
        self.pid_path.unlink(missing_ok=True)

    def _running(self, pid: int) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return _pid_alive(pid)


def _wait(what: str, ready: Any, process: ManagedProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.alive():
            raise ClusterError(
                f"{what} exited during start-up; its log ends:\n{process.log_tail()}"
            )
        with contextlib.suppress(OSError, ssl.SSLError, http.client.HTTPException, ApiError):
            if ready():
                return
        time.sleep(0.1)
    raise ClusterError(
        f"{what} not ready after {timeout_s:.0f} s; its log ends:\n{process.log_tail()}"
    )


# ----------------------------------------------------------------------------- schedulers


@dataclass(frozen=True, slots=True)
class ExtenderTls:
    """kube-scheduler's `tlsConfig` for an HTTPS extender."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """One `extenders[]` entry, as the chart's scheduler config writes it."""

    url_prefix: str
    node_cache_capable: bool = True
    ignorable: bool = False
    http_timeout_s: float = 5.0
    weight: int = 5
    # None: no managedResources, so kube-scheduler sends every pod of the profile (a pod that
    # asks for GPUs only through ResourceClaims requests no extended resource).
    managed_resource: str | None = GPU_RESOURCE
    tls: ExtenderTls | None = None

    def as_config(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": self.weight,
            "nodeCacheCapable": self.node_cache_capable,
            "ignorable": self.ignorable,
            "httpTimeout": f"{self.http_timeout_s:g}s",
        }
        if self.managed_resource is not None:
            entry["managedResources"] = [
                {"name": self.managed_resource, "ignoredByScheduler": False}
            ]
        if self.tls is not None:
            tls: dict[str, Any] = {"caFile": str(self.tls.ca_file)}
            if self.tls.cert_file is not None and self.tls.key_file is not None:
                tls["certFile"] = str(self.tls.cert_file)
                tls["keyFile"] = str(self.tls.key_file)
            if self.tls.server_name:
                tls["serverName"] = self.tls.server_name
            entry["enableHTTPS"] = True
            entry["tlsConfig"] = tls
        return entry


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """A KubeSchedulerConfiguration with one profile and at most one extender."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    extender: ExtenderConfig | None = None
    # The API client's rate limit; kube-scheduler's defaults are 50/100, which would make the
    # binding calls, not the scheduling cycle, the limit of a throughput benchmark.
    client_qps: float = 50.0
    client_burst: int = 100
    # kube-scheduler's own config document, or None for its adaptive default.
    percentage_of_nodes_to_score: int | None = None
    # Serve /debug/pprof on the secure port to anyone on loopback (benchmarks profile with it).
    profiling: bool = False

    def document(self, kubeconfig: Path) -> dict[str, Any]:
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(kubeconfig),
                "qps": self.client_qps,
                "burst": self.client_burst,
            },
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": self.scheduler_name}],
        }
        if self.percentage_of_nodes_to_score is not None:
            config["percentageOfNodesToScore"] = self.percentage_of_nodes_to_score
        if self.profiling:
            config["enableProfiling"] = True
        if self.extender is not None:
            config["extenders"] = [self.extender.as_config()]
        return config


@dataclass(slots=True)
class Scheduler:
    """A running kube-scheduler process and the config it runs with."""

    config: SchedulerConfig
    process: ManagedProcess
    secure_port: int

    def stop(self) -> None:
        self.process.stop()


# ----------------------------------------------------------------------------- the plane


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-schedulers) under one state directory.

    `tie_to_parent` (tests) makes every process exit with the Python process that started it;
    the CLI leaves it off so that `up` returns while the control plane keeps running.
    """

    state_dir: Path
    ports: Ports = field(default_factory=Ports)
    spec: BuildSpec = field(default_factory=BuildSpec.for_version)
    tie_to_parent: bool = False
    schedulers: dict[str, Scheduler] = field(default_factory=dict)
    # Feature gates for kube-apiserver and every kube-scheduler (a cluster sets them alike), and
    # API versions to serve beyond the defaults (`scheduling.k8s.io/v1beta1=true`): for tests of
    # a feature that is off by default.
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: Sequence[str] = ()

    def __post_init__(self) -> None:
        self.pki = Pki(self.state_dir / "pki")
        # The processes this object started (their Popen handles), by name.
        self._started: dict[str, ManagedProcess] = {}

    # --------------------------------------------------------------- paths and clients
    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.state_dir / "scheduler.kubeconfig"

    def admin(self, *, timeout_s: float = 30.0) -> KubeApi:
        return KubeApi(
            self.ports.apiserver,
            ca_file=self.pki.ca_cert,
            cert_file=self.pki.path("admin.crt"),
            key_file=self.pki.path("admin.key"),
            timeout_s=timeout_s,
        )

    def as_token(self, token: str) -> KubeApi:
        return KubeApi(self.ports.apiserver, ca_file=self.pki.ca_cert, token=token)

    def as_user(self, name: str, *, groups: Sequence[str] = ()) -> KubeApi:
        """A client authenticated by a certificate for user `name` in `groups`."""
        cert, key = self.pki.issue_client_cert(f"user-{name}", name, groups=groups)
        return KubeApi(self.ports.apiserver, ca_file=self.pki.ca_cert, cert_file=cert, key_file=key)

    def token_kubeconfig(self, path: Path, token: str, user: str = "token-user") -> Path:
        return write_kubeconfig(
            path, server=self.server, ca_file=self.pki.ca_cert, user=user, token=token
        )

    def pids(self) -> dict[str, int]:
        """The process ids of what this object started and still runs (etcd, kube-apiserver),
        by name; schedulers are in `schedulers`."""
        return {
            name: process.popen.pid
            for name, process in self._started.items()
            if process.popen is not None and process.popen.poll() is None
        }

    def _process(self, name: str, binary: str, argv: list[str]) -> ManagedProcess:
        started = self._started.get(name)
        if started is not None and not argv:
            return started  # a handle to what runs, not a new definition
        return ManagedProcess(
            name=name,
            binary=self.spec.bin_dir / binary,
            argv=argv,
            log_path=self.state_dir / "logs" / f"{name}.log",
            pid_path=self.state_dir / "pids" / f"{name}.pid",
        )

    def _recorded(self) -> list[ManagedProcess]:
        """Every process with a PID file, schedulers first (the order to stop them in)."""
        pids = self.state_dir / "pids"
        found = sorted(pids.glob("*.pid")) if pids.is_dir() else []
        order = {"kube-apiserver": 1, "etcd": 2}
        processes = []
        for pid_file in sorted(found, key=lambda p: order.get(p.stem, 0)):
            name = pid_file.stem
            binary = name if name in ("etcd", "kube-apiserver") else "kube-scheduler"
            processes.append(self._process(name, binary, []))
        return processes

    # --------------------------------------------------------------- etcd and apiserver
    def etcd(self) -> ManagedProcess:
        return self._process(
            "etcd",
            "etcd",
            [
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-url=http://{LOOPBACK}:{self.ports.etcd_client}",
                f"--listen-peer-url=http://{LOOPBACK}:{self.ports.etcd_peer}",
            ],
        )

    def apiserver(self) -> ManagedProcess:
        pki = self.pki
        return self._process(
            "kube-apiserver",
            "kube-apiserver",
            [
                f"--etcd-servers=http://{LOOPBACK}:{self.ports.etcd_client}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                # The `kubernetes` Service's endpoints would name the advertise address, which
                # v1.37 refuses to publish from loopback; nothing here reaches the API through
                # that Service (pods started from the image get 127.0.0.1 directly).
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={pki.path('apiserver.crt')}",
                f"--tls-private-key-file={pki.path('apiserver.key')}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.path('sa.pub')}",
                f"--service-account-signing-key-file={pki.path('sa.key')}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                f"--requestheader-client-ca-file={pki.path('front-proxy-ca.crt')}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.path('front-proxy-client.crt')}",
                f"--proxy-client-key-file={pki.path('front-proxy-client.key')}",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                "--profiling=false",
                *self._gate_flags(),
                *(
                    [f"--runtime-config={','.join(self.runtime_config)}"]
                    if self.runtime_config
                    else []
                ),
                "--v=1",
            ],
        )

    def _gate_flags(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{name}={str(on).lower()}" for name, on in self.feature_gates.items())
        return [f"--feature-gates={gates}"]

    def running(self) -> bool:
        return self._process("kube-apiserver", "kube-apiserver", []).alive()

    def up(self, *, timeout_s: float = 90.0) -> ControlPlane:
        """Start etcd and kube-apiserver and bootstrap what pods need; idempotent PKI."""
        if not self.spec.built():
            raise ClusterError(missing_binaries_reason(self.spec) or "not built")
        for process in self._recorded():
            if process.alive():
                raise ClusterError(
                    f"{process.name} already runs from {self.state_dir} (pid "
                    f"{process.recorded_pid()}): `python3 dev.py cluster down` first"
                )
            process.pid_path.unlink(missing_ok=True)
        check_port_free(self.ports.etcd_client, "etcd (client)")
        check_port_free(self.ports.etcd_peer, "etcd (peer)")
        check_port_free(self.ports.apiserver, "kube-apiserver")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # A fresh store each time: a control plane for tests and benchmarks, not for keeping.
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
        shutil.rmtree(self.state_dir / "logs", ignore_errors=True)
        if not self.pki.exists():
            self.pki.generate()
        write_kubeconfig(
            self.admin_kubeconfig,
            server=self.server,
            ca_file=self.pki.ca_cert,
            user="admin",
            cert_file=self.pki.path("admin.crt"),
            key_file=self.pki.path("admin.key"),
        )
        write_kubeconfig(
            self.scheduler_kubeconfig,
            server=self.server,
            ca_file=self.pki.ca_cert,
            user="system:kube-scheduler",
            cert_file=self.pki.path("scheduler.crt"),
            key_file=self.pki.path("scheduler.key"),
        )
        try:
            self.start_etcd(timeout_s=timeout_s)
            self.start_apiserver(timeout_s=timeout_s)
            self._bootstrap()
        except BaseException:
            self.down()
            raise
        return self

    def start_etcd(self, *, timeout_s: float = 60.0) -> None:
        etcd = self.etcd()
        etcd.start(tie_to_parent=self.tie_to_parent)
        self._started["etcd"] = etcd

        def healthy() -> bool:
            connection = http.client.HTTPConnection(LOOPBACK, self.ports.etcd_client, timeout=2)
            try:
                connection.request("GET", "/health")
                response = connection.getresponse()
                return response.status == 200 and b'"true"' in response.read()
            finally:
                connection.close()

        _wait("etcd", healthy, etcd, timeout_s)

    def start_apiserver(self, *, timeout_s: float = 90.0) -> None:
        """Start (or, after `stop_apiserver`, restart) kube-apiserver and wait for /readyz."""
        check_port_free(self.ports.apiserver, "kube-apiserver")
        apiserver = self.apiserver()
        apiserver.start(tie_to_parent=self.tie_to_parent)
        self._started["kube-apiserver"] = apiserver

        def ready() -> bool:
            with self.admin(timeout_s=5) as api:
                status, _ = api.raw("GET", "/readyz")
                return status == 200

        _wait("kube-apiserver", ready, apiserver, timeout_s)

    def stop_apiserver(self) -> None:
        self._process("kube-apiserver", "kube-apiserver", []).stop()
        self._started.pop("kube-apiserver", None)

    def _bootstrap(self) -> None:
        with self.admin() as api:
            deadline = time.monotonic() + 30
            # The apiserver creates `default` shortly after /readyz; pods need its ServiceAccount.
            while True:
                status, _ = api.raw("GET", "/api/v1/namespaces/default")
                if status == 200:
                    break
                if time.monotonic() > deadline:
                    raise ClusterError("namespace default did not appear")
                time.sleep(0.1)
            status, body = api.raw(
                "POST",
                "/api/v1/namespaces/default/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            )
            if status not in (201, 409):
                raise ApiError(status, body, "creating ServiceAccount default/default")

    # --------------------------------------------------------------- schedulers
    def start_scheduler(
        self, config: SchedulerConfig, *, name: str | None = None, timeout_s: float = 60.0
    ) -> Scheduler:
        """Start a kube-scheduler with `config` and wait until its informers have synced."""
        name = name or f"kube-scheduler-{config.scheduler_name}"
        if name in self.schedulers:
            raise ClusterError(f"a scheduler named {name} already runs")
        secure_port = free_port()
        config_path = self.state_dir / "schedulers" / f"{name}.yaml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(json.dumps(config.document(self.scheduler_kubeconfig), indent=2))
        process = self._process(
            name,
            "kube-scheduler",
            [
                f"--config={config_path}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={secure_port}",
                f"--cert-dir={self.state_dir / 'schedulers' / name}",
                f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
                f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
                *(
                    ["--authorization-always-allow-paths=/healthz,/readyz,/livez,/debug/pprof/*"]
                    if config.profiling
                    else []
                ),
                *self._gate_flags(),
                "--v=1",
            ],
        )
        process.start(tie_to_parent=self.tie_to_parent)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready() -> bool:
            connection = http.client.HTTPSConnection(
                LOOPBACK, secure_port, context=insecure, timeout=2
            )
            try:
                connection.request("GET", "/readyz")
                return connection.getresponse().status == 200
            finally:
                connection.close()

        try:
            _wait(f"kube-scheduler {name}", ready, process, timeout_s)
        except BaseException:
            process.stop()
            raise
        scheduler = Scheduler(config, process, secure_port)
        self.schedulers[name] = scheduler
        return scheduler

    def stop_scheduler(self, name: str) -> None:
        scheduler = self.schedulers.pop(name, None)
        if scheduler is not None:
            scheduler.stop()

    # --------------------------------------------------------------- lifecycle
    def down(self) -> list[str]:
        """Stop every process this state directory recorded, schedulers first; say which."""
        stopped = []
        for scheduler in list(self.schedulers.values()):
            scheduler.stop()
        self.schedulers.clear()
        for process in self._recorded():
            if process.alive():
                stopped.append(f"{process.name} (pid {process.recorded_pid()})")
            process.stop()
        self._started.clear()
        return stopped

    def status(self) -> dict[str, str]:
        report: dict[str, str] = {}
        for process in self._recorded():
            pid = process.recorded_pid()
            report[process.name] = (
                f"running (pid {pid})" if process.alive() else f"dead (pid {pid})"
            )
        if report.get("kube-apiserver", "").startswith("running"):
            try:
                with self.admin(timeout_s=3) as api:
                    version = api.get("/version")
                    status, _ = api.raw("GET", "/readyz")
                report["kube-apiserver"] += f", {version['gitVersion']}, readyz {status}"
            except (OSError, ClusterError, ssl.SSLError, http.client.HTTPException) as exc:
                report["kube-apiserver"] += f", not answering ({type(exc).__name__})"
        return report


# ----------------------------------------------------------------------------- helpers


def bearer_token_of(path: Path) -> str | None:
    """The token of a kubeconfig written by `write_kubeconfig` (tests read it back)."""
    document = json.loads(path.read_text())
    token = document["users"][0]["user"].get("token")
    return str(token) if token is not None else None


def jwt_claims(token: str) -> dict[str, Any]:
    """The (unverified) claims of a service-account token, to show what the issuer put in."""
    payload = token.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    claims = json.loads(base64.urlsafe_b64decode(payload))
    if not isinstance(claims, dict):
        raise ValueError("token claims are not an object")
    return claims


@contextlib.contextmanager
def running_control_plane(
    state_dir: Path,
    *,
    ports: Ports | None = None,
    tie_to_parent: bool = True,
    spec: BuildSpec | None = None,
    feature_gates: Mapping[str, bool] | None = None,
    runtime_config: Sequence[str] = (),
) -> Iterator[ControlPlane]:
    """`up` on entry, `down` on exit (tests and benchmarks)."""
    plane = ControlPlane(
        state_dir,
        ports or Ports.free(),
        spec=spec or BuildSpec.for_version(),
        tie_to_parent=tie_to_parent,
        feature_gates=dict(feature_gates or {}),
        runtime_config=tuple(runtime_config),
    )
    plane.up()
    try:
        yield plane
    finally:
        plane.down()


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dev.py cluster",
        description="A real etcd + kube-apiserver + kube-scheduler on loopback (v1.37; v1.36 "
        "with --kubernetes).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser(
        "build", help="build the binaries from tools/k8s into .tools/k8s"
    )
    build_cmd.add_argument(
        "--all", action="store_true", help="build every version tools/k8s pins (CI's matrix)"
    )
    up = commands.add_parser("up", help="start etcd, kube-apiserver and one kube-scheduler")
    for sub in (build_cmd, up):
        sub.add_argument(
            "--kubernetes",
            default=None,
            metavar="VERSION",
            help=f"which pinned version (v1.37, v1.36; default: ${VERSION_ENV}, else the newest)",
        )
    down = commands.add_parser("down", help="stop every process `up` started")
    status = commands.add_parser("status", help="which processes run, and the API's version")
    for sub in (up, down, status):
        sub.add_argument(
            "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="PKI, data, logs, PIDs"
        )
    defaults = Ports()
    up.add_argument("--etcd-port", type=int, default=defaults.etcd_client)
    up.add_argument("--etcd-peer-port", type=int, default=defaults.etcd_peer)
    up.add_argument("--apiserver-port", type=int, default=defaults.apiserver)
    up.add_argument(
        "--extender",
        default="http://127.0.0.1:8888",
        help="the scorer's URL for the scheduler's extender ('' for a scheduler without one)",
    )
    up.add_argument(
        "--full-nodes",
        action="store_true",
        help="nodeCacheCapable: false (the scorer then needs no --node-cache)",
    )
    up.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            specs = BuildSpec.every() if args.all else [BuildSpec.for_version(args.kubernetes)]
            for spec in specs:
                build(spec)
            return 0
        if args.command == "down":
            plane = ControlPlane(args.state_dir)
            stopped = plane.down()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            return 0
        if args.command == "status":
            report = ControlPlane(args.state_dir).status()
            if not report:
                print(f"nothing recorded in {args.state_dir}")
                return 1
            for name, state in report.items():
                print(f"{name}: {state}")
            return 0 if all(s.startswith("running") for s in report.values()) else 1
        ports = Ports(args.etcd_port, args.etcd_peer_port, args.apiserver_port)
        plane = ControlPlane(args.state_dir, ports, BuildSpec.for_version(args.kubernetes)).up()
        extender = (
            ExtenderConfig(args.extender, node_cache_capable=not args.full_nodes, ignorable=True)
            if args.extender
            else None
        )
        plane.start_scheduler(SchedulerConfig(args.scheduler_name, extender), name="kube-scheduler")
        _print_up(plane, args.scheduler_name, extender)
        return 0
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1


def _print_up(plane: ControlPlane, scheduler_name: str, extender: ExtenderConfig | None) -> None:
    print(f"kube-apiserver {plane.spec.kubernetes_version} at {plane.server}")
    print(f"  export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"kube-scheduler: pods with schedulerName {scheduler_name!r}", end="")
    if extender is None:
        print(" (no extender)")
    else:
        mode = "names only" if extender.node_cache_capable else "full nodes"
        print(f", extender {extender.url_prefix} ({mode}, ignorable)")
        flag = " --node-cache" if extender.node_cache_capable else ""
        print(
            f"  scorer: .venv/bin/gpu-scorer serve --port {extender.url_prefix.rsplit(':', 1)[-1]}"
            f"{flag} --kubeconfig {plane.admin_kubeconfig}"
        )
    print(f"logs in {plane.state_dir / 'logs'}; stop with `python3 dev.py cluster down`")


if __name__ == "__main__":
    sys.exit(main())
