"""Plays kube-scheduler against the extender over HTTP, for the demo and the tests.

A real kube-scheduler runs its own filters first (here: allocation accounting of `nvidia.com/gpu`,
and cordoned nodes), sends only the nodes that survive them to the extender's filter, sends only
the nodes that pass that filter to prioritize, skips prioritize when one node is left, multiplies
the extender's 0..10 score by the configured weight and by 10
(`MaxNodeScore / MaxExtenderPriority`), and picks uniformly among the best-scored nodes. This
module does the same, in the same wire format as the captures of a real v1.36 scheduler
(capitalised keys, `Nodes: {"items": [...]}` with full Node objects, or `NodeNames` in names-only
mode), so the scorer under test cannot tell the difference. It records, for every attempt, where
the pod went, why, and why every other node lost.

What it does not model: preemption, pod affinity, and the default plugins' own scores (for a pod
that only asks for GPUs they barely differ between empty GPU nodes). The load a pod puts on a node
goes to a `LoadSink`, which the demo wires to the node's simulated GPUs.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol
from urllib.parse import urlsplit

from exporter_scheduler.core.hints import FALLBACK_UTILIZATION, MIN_GPU_MEMORY_MIB, MODEL_PREFERENCE
from gpu_contract.schema import DEFAULT_PREFIX

GPU_RESOURCE: Final = "nvidia.com/gpu"
SCHEDULER_NAME: Final = "gpu-scheduler"
# k8s.io/kube-scheduler/extender/v1: MaxExtenderPriority; the framework's MaxNodeScore is 100.
MAX_EXTENDER_PRIORITY: Final = 10
MAX_NODE_SCORE: Final = 100
# kube-scheduler's own texts, so the recorded reasons read like a FailedScheduling event.
INSUFFICIENT_GPU: Final = f"Insufficient {GPU_RESOURCE}"
UNSCHEDULABLE: Final = "node(s) were unschedulable"
# The driver's own words for nodes that passed the filter but were not picked.
LOWER_SCORE: Final = "lower score"
LOST_TIE: Final = "same score, lost the tie"

Json = dict[str, Any]
NodeMode = Literal["full", "names"]


# ----------------------------------------------------------------------------------------------
# Pods


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One GPU pod of the stream: what it asks for and how long it runs once bound."""

    name: str
    uid: str
    gpus: int
    run_s: float
    # Busy fraction the pod's work drives on each of its GPUs.
    utilization: float
    # Pod annotations (full keys), e.g. the scorer's hints.
    annotations: Mapping[str, str] = field(default_factory=dict)
    namespace: str = "default"

    def hint(self, name: str, prefix: str = DEFAULT_PREFIX) -> str | None:
        return self.annotations.get(prefix + name)

    def hints_text(self, prefix: str = DEFAULT_PREFIX) -> str:
        """The pod's hints in short form for a log line: `prefer A100,V100 <0.80; mem>=40000`."""
        parts: list[str] = []
        chain = self.hint(MODEL_PREFERENCE, prefix)
        if chain:
            fallback = self.hint(FALLBACK_UTILIZATION, prefix)
            parts.append(f"prefer {chain}" + (f" <{fallback}" if fallback else ""))
        memory = self.hint(MIN_GPU_MEMORY_MIB, prefix)
        if memory:
            parts.append(f"mem>={memory}MiB")
        return "; ".join(parts)


def pod_object(pod: PodSpec, *, created_at: datetime) -> Json:
    """The v1.Pod as the scheduler would send it (the shape of the captured requests)."""
    quantity = str(pod.gpus)
    return {
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "creationTimestamp": created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "labels": {"app": "gpu-demo"},
            "annotations": dict(pod.annotations),
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "pause:3.10",
                    "resources": {
                        "limits": {GPU_RESOURCE: quantity},
                        "requests": {"cpu": "100m", "memory": "64Mi", GPU_RESOURCE: quantity},
                    },
                }
            ],
            "restartPolicy": "Never",
            "schedulerName": SCHEDULER_NAME,
            "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


@dataclass(frozen=True, slots=True)
class PodMix:
    """The shape of the pod stream: request sizes and how often pods carry each hint."""

    gpu_weights: Mapping[int, float] = field(
        default_factory=lambda: {1: 0.45, 2: 0.25, 4: 0.2, 8: 0.1}
    )
    preference_share: float = 0.3
    preference_chain: str = "A100,V100"
    fallback_utilization: str = "0.80"
    memory_share: float = 0.2
    memory_mib_choices: tuple[int, ...] = (16000, 30000, 40000, 70000)
    run_s_range: tuple[float, float] = (10.0, 30.0)
    utilization_range: tuple[float, float] = (0.55, 0.95)


class PodFactory:
    """A seeded stream of GPU pods: same seed, same pods."""

    def __init__(self, *, seed: int, mix: PodMix | None = None, prefix: str = DEFAULT_PREFIX):
        self._rng = random.Random(seed)
        self._mix = mix or PodMix()
        self._prefix = prefix
        self._count = 0

    def next(self) -> PodSpec:
        rng, mix = self._rng, self._mix
        self._count += 1
        sizes = sorted(mix.gpu_weights)
        gpus = rng.choices(sizes, weights=[mix.gpu_weights[s] for s in sizes])[0]
        annotations: dict[str, str] = {}
        if rng.random() < mix.preference_share:
            annotations[self._prefix + MODEL_PREFERENCE] = mix.preference_chain
            annotations[self._prefix + FALLBACK_UTILIZATION] = mix.fallback_utilization
        if rng.random() < mix.memory_share:
            memory = rng.choice(mix.memory_mib_choices)
            annotations[self._prefix + MIN_GPU_MEMORY_MIB] = str(memory)
        return PodSpec(
            name=f"train-{self._count:04d}",
            uid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            gpus=gpus,
            run_s=round(rng.uniform(*mix.run_s_range), 1),
            utilization=round(rng.uniform(*mix.utilization_range), 2),
            annotations=annotations,
        )


# ----------------------------------------------------------------------------------------------
# Nodes and allocation


def node_name(node: Mapping[str, Any]) -> str:
    return str(node.get("metadata", {}).get("name", ""))


def allocatable_gpus(node: Mapping[str, Any]) -> int:
    """`status.allocatable["nvidia.com/gpu"]` as an integer; 0 when absent or not a count."""
    value = node.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0")
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def short_model_name(product: str) -> str:
    """`NVIDIA-A100-SXM4-80GB` or `Tesla V100-SXM2-32GB` -> `A100` / `V100`, for a table."""
    for token in "-".join(product.replace("_", " ").split()).split("-"):
        if token and token.upper() != "NVIDIA" and any(c.isdigit() for c in token):
            return token.upper()
    return product


@dataclass(slots=True)
class Binding:
    pod: PodSpec
    node: str
    bound_at_s: float

    @property
    def ends_at_s(self) -> float:
        return self.bound_at_s + self.pod.run_s


class Allocation:
    """Which pods hold how many GPUs on which node: the default scheduler's resource accounting."""

    def __init__(self) -> None:
        self._bindings: dict[str, Binding] = {}

    def used(self, node: str) -> int:
        return sum(b.pod.gpus for b in self._bindings.values() if b.node == node)

    def bind(self, pod: PodSpec, node: str, now_s: float) -> None:
        self._bindings[pod.name] = Binding(pod, node, now_s)

    def release_finished(self, now_s: float) -> list[Binding]:
        done = [b for b in self._bindings.values() if b.ends_at_s <= now_s]
        for binding in done:
            del self._bindings[binding.pod.name]
        return done

    def running(self) -> list[Binding]:
        return list(self._bindings.values())


class LoadSink(Protocol):
    """Where a bound pod's GPU work goes (the demo: the node's simulated GPUs)."""

    def pod_started(self, node: str, pod: PodSpec) -> None: ...

    def pod_ended(self, node: str, pod: PodSpec) -> None: ...


class NoLoad:
    def pod_started(self, node: str, pod: PodSpec) -> None:
        return None

    def pod_ended(self, node: str, pod: PodSpec) -> None:
        return None


# ----------------------------------------------------------------------------------------------
# The extender over HTTP


class ExtenderError(RuntimeError):
    """The extender answered with a non-200 status, an unreadable body or a set `Error`."""


@dataclass(frozen=True, slots=True)
class ExtenderCall:
    verb: str
    status: int
    latency_s: float
    request_bytes: int


class ExtenderClient:
    """POSTs to `<url>/<verb>` on one kept-alive connection, as Go's HTTP client does."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"extender url must be http://host:port[/prefix], got {url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.calls: list[ExtenderCall] = []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, verb: str, body: Json) -> Any:
        payload = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}
        path = f"{self._prefix}/{verb}"
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout_s
                )
            started = time.perf_counter()
            try:
                self._conn.request("POST", path, body=payload, headers=headers)
                response = self._conn.getresponse()
                raw = response.read()
            except (ConnectionError, http.client.HTTPException):
                # A kept-alive connection the server had closed: Go's transport retries a
                # request with a replayable body once on a new connection in that case.
                self.close()
                if attempt == 2:
                    raise
                continue
            latency_s = time.perf_counter() - started
            self.calls.append(ExtenderCall(verb, response.status, latency_s, len(payload)))
            if response.status != 200:
                raise ExtenderError(f"{verb}: HTTP {response.status}: {raw[:200]!r}")
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise ExtenderError(f"{verb}: reply is not JSON: {exc}") from exc
        raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------
# One scheduling attempt


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one scheduling cycle did for one pod, with every node's fate."""

    pod: PodSpec
    at_s: float
    node: str | None
    # Why the pod went where it went, or why it stays pending.
    why: str
    # Nodes it did not get, with the reason: the scheduler's own (allocation) or the extender's.
    rejected: Mapping[str, str]
    # Extender scores (0..10) of the nodes that passed the filter; empty without prioritize.
    scores: Mapping[str, int]
    sent_to_filter: tuple[str, ...]
    prioritized: bool
    error: str | None = None

    @property
    def placed(self) -> bool:
        return self.node is not None


def failed_scheduling_message(total_nodes: int, reasons: Iterable[str]) -> str:
    """`0/8 nodes are available: 3 Insufficient nvidia.com/gpu, 5 <reason>.`

    Like kube-scheduler's FitError: each distinct text counted once, the entries sorted as strings.
    """
    histogram: dict[str, int] = {}
    for reason in reasons:
        histogram[reason] = histogram.get(reason, 0) + 1
    entries = sorted(f"{count} {reason}" for reason, count in histogram.items())
    return f"0/{total_nodes} nodes are available: {', '.join(entries)}."


@dataclass(frozen=True, slots=True)
class DriverConfig:
    mode: NodeMode = "full"
    # The extender's `weight` in the KubeSchedulerConfiguration (the captures used 5).
    weight: int = 5
    seed: int = 0
    # A pod that found no node waits before its next try, doubling per failure, as
    # kube-scheduler's podInitialBackoffSeconds (1) and podMaxBackoffSeconds (10) do.
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 10.0


class SchedulerDriver:
    """Schedules pods one at a time against the extender, like one kube-scheduler profile."""

    def __init__(
        self,
        *,
        extender: ExtenderClient,
        list_nodes: Callable[[], Sequence[Mapping[str, Any]]],
        config: DriverConfig | None = None,
        load: LoadSink | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.extender = extender
        self._list_nodes = list_nodes
        self.config = config or DriverConfig()
        self._load = load or NoLoad()
        self._wall_clock = wall_clock
        self._tie_rng = random.Random(self.config.seed)
        self.allocation = Allocation()
        # (pod, not before, failed attempts so far), oldest first.
        self.pending: deque[tuple[PodSpec, float, int]] = deque()
        self.attempts: list[Attempt] = []
        # The latest attempt per pod: where each pod went (or why it waits).
        self.outcome: dict[str, Attempt] = {}
        self.finished: list[Binding] = []

    # -- the cycle ------------------------------------------------------------------------------

    def schedule(self, pod: PodSpec, *, now_s: float) -> Attempt:
        """One scheduling cycle: allocation filter, extender filter, prioritize, select, bind."""
        nodes = list(self._list_nodes())
        total = len(nodes)
        rejected: dict[str, str] = {}
        candidates: list[Mapping[str, Any]] = []
        for node in nodes:
            name = node_name(node)
            if node.get("spec", {}).get("unschedulable"):
                rejected[name] = UNSCHEDULABLE
            elif allocatable_gpus(node) - self.allocation.used(name) < pod.gpus:
                rejected[name] = INSUFFICIENT_GPU
            else:
                candidates.append(node)
        sent = tuple(node_name(n) for n in candidates)

        def pending(why: str, *, prioritized: bool = False, error: str | None = None) -> Attempt:
            return self._record(
                Attempt(pod, now_s, None, why, dict(rejected), {}, sent, prioritized, error)
            )

        if not candidates:
            # The scheduler calls no extender when its own filters left nothing.
            return pending(failed_scheduling_message(total, rejected.values()))
        pod_json = pod_object(pod, created_at=self._wall_clock())
        try:
            passed = self._filter(pod_json, candidates, rejected)
        except (ExtenderError, OSError, http.client.HTTPException) as exc:
            return pending(f"extender filter failed: {exc}", error=str(exc))
        if not passed:
            return pending(failed_scheduling_message(total, rejected.values()))
        if len(passed) == 1:
            # kube-scheduler skips scoring entirely when one feasible node is left.
            only = node_name(passed[0])
            attempt = Attempt(
                pod,
                now_s,
                only,
                "only node left after the filter",
                dict(rejected),
                {},
                sent,
                prioritized=False,
            )
            return self._bind(attempt)
        try:
            scores = self._prioritize(pod_json, passed)
        except (ExtenderError, OSError, http.client.HTTPException) as exc:
            return pending(f"extender prioritize failed: {exc}", prioritized=True, error=str(exc))
        chosen, why = self._select(passed, scores)
        best = scores.get(chosen, 0)
        for node in passed:
            name = node_name(node)
            if name == chosen:
                continue
            # Uniform texts, so the summary counts them like the scheduler's event would; the
            # scores themselves stay in `Attempt.scores`.
            rejected[name] = LOWER_SCORE if scores.get(name, 0) < best else LOST_TIE
        return self._bind(
            Attempt(pod, now_s, chosen, why, dict(rejected), scores, sent, prioritized=True)
        )

    def _filter(
        self,
        pod_json: Json,
        candidates: Sequence[Mapping[str, Any]],
        rejected: dict[str, str],
    ) -> list[Mapping[str, Any]]:
        names = [node_name(n) for n in candidates]
        if self.config.mode == "full":
            body: Json = {"Pod": pod_json, "Nodes": _node_list(candidates), "NodeNames": None}
        else:
            body = {"Pod": pod_json, "Nodes": None, "NodeNames": names}
        reply = _lower_keys(self.extender.post("filter", body))
        error = reply.get("error") or ""
        if error:
            raise ExtenderError(str(error))
        for key in ("failednodes", "failedandunresolvablenodes"):
            for name, reason in (reply.get(key) or {}).items():
                rejected[str(name)] = str(reason)
        if self.config.mode == "full":
            # In this mode the scheduler reads only Nodes.items; names alone mean "none passed".
            items = (reply.get("nodes") or {}).get("items") or []
            passed_names = {node_name(n) for n in items}
        else:
            passed_names = {str(n) for n in reply.get("nodenames") or []}
        unknown = passed_names - set(names)
        if unknown:
            raise ExtenderError(f"filter returned nodes that were not sent: {sorted(unknown)}")
        passed = [n for n in candidates if node_name(n) in passed_names]
        for name in names:
            if name not in passed_names and name not in rejected:
                rejected[name] = "rejected by the extender without a reason"
        return passed

    def _prioritize(self, pod_json: Json, passed: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        if self.config.mode == "full":
            body: Json = {"Pod": pod_json, "Nodes": _node_list(passed), "NodeNames": None}
        else:
            body = {"Pod": pod_json, "Nodes": None, "NodeNames": [node_name(n) for n in passed]}
        reply = self.extender.post("prioritize", body)
        if not isinstance(reply, list):
            raise ExtenderError("prioritize reply is not a list")
        scores: dict[str, int] = {}
        for entry in reply:
            lowered = _lower_keys(entry) if isinstance(entry, dict) else {}
            host, score = lowered.get("host"), lowered.get("score")
            if isinstance(host, str) and isinstance(score, int):
                scores[host] = score
        return scores

    def _select(
        self, passed: Sequence[Mapping[str, Any]], scores: Mapping[str, int]
    ) -> tuple[str, str]:
        """Highest weighted score wins; ties go to a seeded uniform pick, as selectHost does."""
        scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
        totals = {
            node_name(n): scores.get(node_name(n), 0) * self.config.weight * scale for n in passed
        }
        best = max(totals.values())
        tied = sorted(name for name, total in totals.items() if total == best)
        chosen = tied[0] if len(tied) == 1 else self._tie_rng.choice(tied)
        runner_up = max((t for n, t in totals.items() if n != chosen), default=0)
        why = f"best score {scores.get(chosen, 0)}/10 of {len(passed)}"
        if len(tied) > 1:
            why += f", tie of {len(tied)} broken at random"
        elif runner_up:
            why += f", next {runner_up // (self.config.weight * scale)}"
        return chosen, why

    def _bind(self, attempt: Attempt) -> Attempt:
        assert attempt.node is not None
        self.allocation.bind(attempt.pod, attempt.node, attempt.at_s)
        self._load.pod_started(attempt.node, attempt.pod)
        return self._record(attempt)

    def _record(self, attempt: Attempt) -> Attempt:
        self.attempts.append(attempt)
        self.outcome[attempt.pod.name] = attempt
        return attempt

    # -- the queue ------------------------------------------------------------------------------

    def submit(self, pod: PodSpec, *, now_s: float) -> None:
        self.pending.append((pod, now_s, 0))

    def step(self, *, now_s: float) -> list[Attempt]:
        """End finished pods, then try every pending pod whose back-off has passed, oldest first."""
        for binding in self.allocation.release_finished(now_s):
            self._load.pod_ended(binding.node, binding.pod)
            self.finished.append(binding)
        attempts: list[Attempt] = []
        waiting: deque[tuple[PodSpec, float, int]] = deque()
        while self.pending:
            pod, not_before_s, failures = self.pending.popleft()
            if not_before_s > now_s:
                waiting.append((pod, not_before_s, failures))
                continue
            attempt = self.schedule(pod, now_s=now_s)
            attempts.append(attempt)
            if not attempt.placed:
                waiting.append((pod, now_s + self.backoff_s(failures + 1), failures + 1))
        self.pending = waiting
        return attempts

    def backoff_s(self, failures: int) -> float:
        """Wait after the `failures`-th failed attempt: 1, 2, 4, 8, 10, 10, ... seconds."""
        doubled = self.config.initial_backoff_s * 2 ** min(max(0, failures - 1), 30)
        return float(min(self.config.max_backoff_s, doubled))

    # -- figures --------------------------------------------------------------------------------

    def placed_pods(self) -> int:
        return sum(1 for a in self.outcome.values() if a.placed)

    def pending_pods(self) -> int:
        return len(self.pending)

    def latency_ms(self, verb: str | None = None) -> dict[str, float]:
        """p50/p99/max of the extender round trips in milliseconds (empty when none were made)."""
        samples = sorted(c.latency_s * 1000 for c in self.extender.calls if verb in (None, c.verb))
        if not samples:
            return {}
        return {
            "count": float(len(samples)),
            "p50": percentile(samples, 50),
            "p99": percentile(samples, 99),
            "max": samples[-1],
        }


def percentile(sorted_samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted samples."""
    if not sorted_samples:
        raise ValueError("no samples")
    rank = max(1, -(-len(sorted_samples) * pct // 100))
    return sorted_samples[int(min(rank, len(sorted_samples))) - 1]


def _lower_keys(value: Any) -> Json:
    """The scheduler decodes replies case-insensitively; so does this driver."""
    if not isinstance(value, dict):
        raise ExtenderError("reply is not a JSON object")
    return {str(k).lower(): v for k, v in value.items()}


def _node_list(nodes: Sequence[Mapping[str, Any]]) -> Json:
    """A v1.NodeList as the scheduler serialises it: `{"metadata": {}, "items": [...]}`."""
    return {"metadata": {}, "items": list(nodes)}
