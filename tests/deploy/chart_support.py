"""Render the Helm chart with the real `helm` binary and validate what it renders, once per run.

The deploy tests share this module so that each values variant is rendered exactly once
(`render(variant)` is cached) and the Kubernetes OpenAPI schemas are loaded once per version:
the whole deploy suite then stays fast enough to run on every change.

Where helm is missing, the tests skip locally and fail in CI (`CI=true`), so a CI image without
helm cannot pass by skipping.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import referencing
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-live-scheduler"
RELEASE = "gls"
NAMESPACE = "gpu-system"
DEFAULT_KUBE_VERSION = "1.36.0"
# Real wire captures (kube-apiserver and kube-scheduler v1.36), kept with the tests.
FIXTURES = ROOT / "tests" / "fixtures"
# Every manifest is validated against the oldest supported and a current Kubernetes.
SCHEMA_VERSIONS = ("1.36.0", "1.37.0")

Manifest = dict[str, Any]


def helm_binary() -> Path | None:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which("helm")
    return Path(found) if found else None


def require_helm() -> Path:
    """The helm binary; skip without it locally, fail without it in CI."""
    helm = helm_binary()
    if helm is not None:
        return helm
    message = "helm not found in .tools/bin or PATH (python3 dev.py tools installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the chart checks")
    pytest.skip(message)


@dataclass(frozen=True)
class Variant:
    """One set of chart values worth rendering, with the toggle it exercises."""

    values: Mapping[str, Any] = field(default_factory=dict)
    kube_version: str = DEFAULT_KUBE_VERSION


TLS = {"enabled": True, "secretName": "gpu-scorer-tls"}
MTLS = {**TLS, "clientAuth": True, "clientSecretName": "gpu-scheduler-client-tls"}
# Two tenant profiles over a top-level policy: one chosen by namespace names, one by labels.
TENANT_POLICY: dict[str, Any] = {
    "utilization_limit": 0.9,
    "profiles": [
        {
            "name": "training",
            "namespaces": ["ml-train-*", "research"],
            "utilization_limit": 0.5,
            "weight_temperature": 2,
        },
        {
            "name": "inference",
            "namespace-selector": {
                "matchLabels": {"workload": "inference"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}],
            },
            "missing_data": "strict",
            "min_gpu_fit_probability": 0.9,
        },
    ],
}
# A guard selector with every operator.
GUARD_SELECTOR: dict[str, Any] = {
    "matchLabels": {"gpu.acme.io/tenant": "yes"},
    "matchExpressions": [
        {"key": "team", "operator": "In", "values": ["ml", "cv"]},
        {"key": "tier", "operator": "NotIn", "values": ["dev"]},
        {"key": "gpu.acme.io/quota", "operator": "Exists"},
        {"key": "legacy", "operator": "DoesNotExist"},
    ],
}

VARIANTS: dict[str, Variant] = {
    "defaults": Variant(),
    "defaults-k8s-1.37": Variant(kube_version="1.37.0"),
    "scheduler-off": Variant({"scheduler": {"enabled": False}}),
    "full-node": Variant({"scorer": {"nodeCache": False}}),
    "full-node-no-pod-watch": Variant({"scorer": {"nodeCache": False, "podWatch": False}}),
    "full-node-own-load-node-watch": Variant(
        {"scorer": {"nodeCache": False, "ownLoadNodeWatch": True}}
    ),
    "no-pod-watch": Variant({"scorer": {"podWatch": False}}),
    "scorer-dra": Variant(
        {"scorer": {"dra": {"enabled": True, "extendedResource": True}}},
        kube_version="1.37.0",
    ),
    "sidecar": Variant({"scorer": {"mode": "sidecar"}}),
    "sidecar-full-node": Variant({"scorer": {"mode": "sidecar", "nodeCache": False}}),
    "admission-policy-off": Variant({"agent": {"admissionPolicy": {"enabled": False}}}),
    "gpu-data-policy-off": Variant({"gpuDataPolicy": {"enabled": False}}),
    "network-policy-off": Variant({"networkPolicy": {"enabled": False}}),
    "network-policy-extra-extender": Variant(
        {
            "scheduler": {"enabled": False},
            "networkPolicy": {
                "extenderFrom": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"component": "kube-scheduler"}},
                    }
                ],
                "metricsFrom": [],
            },
        }
    ),
    "gpu-data-break-glass": Variant(
        {"gpuDataPolicy": {"breakGlass": {"users": ["alice"], "groups": ["gpu-oncall"]}}}
    ),
    "service-monitor": Variant(
        {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}
    ),
    "prometheus-rule": Variant(
        {
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "prom"},
                "alertLabels": {"team": "gpu-platform"},
            }
        }
    ),
    "grafana-dashboard": Variant(
        {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "GPU"},
            }
        }
    ),
    "tls": Variant({"scorer": {"tls": TLS}}),
    "mtls-service-monitor": Variant(
        {
            "scorer": {"tls": MTLS},
            "serviceMonitor": {"enabled": True},
        }
    ),
    "sidecar-tls": Variant({"scorer": {"mode": "sidecar", "tls": TLS}}),
    "cert-manager-mtls": Variant(
        {
            "scorer": {
                "tls": {
                    "enabled": True,
                    "clientAuth": True,
                    "certManager": {
                        "enabled": True,
                        "issuerRef": {"name": "gpu-ca", "kind": "ClusterIssuer"},
                    },
                }
            }
        }
    ),
    "simulated-custom-prefix": Variant(
        {
            "annotationPrefix": "gpu.acme.io",
            "agent": {
                "source": "simulated",
                "runtimeClassName": "nvidia",
                "heartbeatSeconds": 30,
                "priorityClassName": "system-node-critical",
            },
        }
    ),
    "path-prefix-policy": Variant(
        {
            "scorer": {
                "pathPrefix": "/gpu-extender/",
                "staleAfterSeconds": 120,
                "policy": {
                    "utilization_limit": 0.8,
                    "missing_data": "strict",
                    "inflight_max_s": 300,
                    "inflight_load_delay_s": 90,
                    "inflight_gpu_load": 0.5,
                    "min_gpu_fit_probability": 0.9,
                    "blind_device_plugin": False,
                },
            },
            "scheduler": {"extender": {"ignorable": False, "weight": 10, "httpTimeout": "500ms"}},
        }
    ),
    "agent-only": Variant({"scorer": {"enabled": False}, "scheduler": {"enabled": False}}),
    "pod-resources-off": Variant({"agent": {"podResources": {"enabled": False}}}),
    "dra-off": Variant({"agent": {"dra": {"enabled": False}}}),
    "dra-other-driver": Variant({"agent": {"dra": {"driver": "gpu.example.org"}}}),
    "process-attribution": Variant({"agent": {"podUsage": {"processAttribution": True}}}),
    "tenant-profiles": Variant({"scorer": {"policy": TENANT_POLICY}}),
    "tenant-profiles-by-name": Variant(
        {"scorer": {"policy": {"profiles": [TENANT_POLICY["profiles"][0]]}}}
    ),
    "tenant-profiles-full-node-no-pod-watch": Variant(
        {"scorer": {"nodeCache": False, "podWatch": False, "policy": TENANT_POLICY}}
    ),
    "scheduler-guard-deny": Variant(
        {
            "scheduler": {
                "name": "gpu-live",
                "extender": {
                    "managedResources": [
                        {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
                        {"name": "nvidia.com/mig-1g.10gb", "ignoredByScheduler": False},
                    ]
                },
            },
            "schedulerGuard": {
                "namespaceSelector": GUARD_SELECTOR,
                "requireScheduler": {"validationActions": ["Deny"], "failurePolicy": "Ignore"},
                "restrictScheduler": {"validationActions": ["Deny", "Audit"]},
            },
        }
    ),
    "scheduler-guard-off": Variant(
        {
            "schedulerGuard": {
                "requireScheduler": {"enabled": False},
                "restrictScheduler": {"enabled": False},
            }
        }
    ),
    "gpu-pod-label": Variant({"scorer": {"gpuPodLabel": {"enabled": True}}}),
    "gpu-pod-label-sidecar-no-job": Variant(
        {
            "annotationPrefix": "gpu.acme.io",
            "scorer": {"mode": "sidecar", "gpuPodLabel": {"enabled": True, "labelExisting": False}},
        }
    ),
    "pinned-images": Variant(
        {
            "image": {"digest": "sha256:" + "ab" * 32},
            "scheduler": {"image": {"tag": "v1.33.2"}, "replicas": 1},
        }
    ),
}


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def _run_helm(args: list[str], values: Mapping[str, Any]) -> str:
    helm = require_helm()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(values, handle)  # JSON is YAML, and keeps numbers typed (unlike --set)
        values_file = handle.name
    try:
        done = subprocess.run(
            [str(helm), *args, "-f", values_file],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/gls-helm-cache"},
        )
    finally:
        os.unlink(values_file)
    if done.returncode != 0:
        raise HelmError(done.stderr.strip() or done.stdout.strip())
    return done.stdout


def template(values: Mapping[str, Any], *, kube_version: str = DEFAULT_KUBE_VERSION) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    return _run_helm([*args, "--kube-version", kube_version], values)


def notes(values: Mapping[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (client-side dry run: no cluster contacted).

    A client-side install takes helm's built-in Kubernetes version (v1.35 for helm 4.1) and has
    no `--kube-version`, so it would refuse the chart's `kubeVersion`: the notes are rendered
    from a copy of the chart without that line (`test_chart_render` checks the gate itself)."""
    with tempfile.TemporaryDirectory() as scratch:
        chart = Path(scratch) / CHART.name
        shutil.copytree(CHART, chart)
        manifest = chart / "Chart.yaml"
        lines = manifest.read_text().splitlines(keepends=True)
        manifest.write_text("".join(x for x in lines if not x.startswith("kubeVersion:")))
        args = ["install", RELEASE, str(chart), "--namespace", NAMESPACE, "--dry-run=client"]
        output = _run_helm(args, values)
    return output[output.index("NOTES:") :]


def lint(values: Mapping[str, Any], *, kube_version: str = DEFAULT_KUBE_VERSION) -> str:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    return _run_helm([*args, "--kube-version", kube_version], values)


@dataclass(frozen=True)
class Rendered:
    """The manifests one `helm template` produced."""

    text: str
    manifests: tuple[Manifest, ...]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def get(self, kind: str, name: str) -> Manifest:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def maybe(self, kind: str, name: str) -> Manifest | None:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        return found[0] if found else None

    def scheduler_config(self) -> Manifest:
        config_map = self.get("ConfigMap", f"{FULLNAME}-scheduler")
        loaded = yaml.safe_load(config_map["data"]["config.yaml"])
        assert isinstance(loaded, dict)
        return loaded

    def admission_policy(self) -> Manifest:
        return self.get("ValidatingAdmissionPolicy", f"{FULLNAME}-agent-own-node-annotations")


FULLNAME = f"{RELEASE}-gpu-live-scheduler"


def parse_manifests(text: str) -> tuple[Manifest, ...]:
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


@functools.cache
def render(variant_id: str) -> Rendered:
    variant = VARIANTS[variant_id]
    text = template(variant.values, kube_version=variant.kube_version)
    return Rendered(text=text, manifests=parse_manifests(text))


def containers(workload: Manifest) -> dict[str, Manifest]:
    spec = workload["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def env_of(container: Manifest, rendered: Rendered) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom ConfigMaps, then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config_map = rendered.get("ConfigMap", source["configMapRef"]["name"])
        env.update(config_map["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "<from " + ",".join(item.get("valueFrom", {})) + ">")
    return env


# ---------------------------------------------------------------------- OpenAPI validation
# Kinds served by CRDs have no schema in Kubernetes' OpenAPI document.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
}


class _SchemaStore:
    """Kubernetes' OpenAPI schemas as shipped by the `kubernetes-validate` package (offline)."""

    def __init__(self, version: str) -> None:
        self.version = version
        root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
        self.folder = root / f"v{version}-local-strict"
        if not self.folder.is_dir():
            raise LookupError(f"kubernetes-validate ships no schemas for {version}")
        definitions = json.loads((self.folder / "_definitions.json").read_text())
        self.registry: referencing.Registry[Any] = referencing.Registry().with_resource(
            definitions["$id"], referencing.Resource.from_contents(definitions)
        )
        self._validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}

    def validator(self, api_version: str, kind: str) -> jsonschema.protocols.Validator:
        key = (api_version, kind)
        if key not in self._validators:
            group, _, version = api_version.rpartition("/")
            group_part = group.split(".")[0] + "-" if group else ""
            name = f"{kind.lower()}-{group_part}{version}.json"
            schema = json.loads((self.folder / name).read_text())
            validator_cls = jsonschema.validators.validator_for(schema)
            self._validators[key] = validator_cls(schema, registry=self.registry)
        return self._validators[key]


@functools.cache
def schema_store(version: str) -> _SchemaStore:
    return _SchemaStore(version)


def openapi_errors(manifest: Manifest, version: str) -> Iterator[str]:
    """Every schema violation of one manifest, as `kind/name: path: message`."""
    validator = schema_store(version).validator(manifest["apiVersion"], manifest["kind"])
    name = f"{manifest['kind']}/{manifest['metadata']['name']}"
    for error in validator.iter_errors(manifest):
        path = ".".join(str(p) for p in error.absolute_path)
        yield f"{name}: {path}: {error.message}"
