"""Prometheus metrics of the scorer, on a registry of their own per app instance.

A fresh `CollectorRegistry` per `ScorerMetrics` keeps tests (and two apps in one process)
independent. Per-node outcomes are counted in plain Python first and added to the counters once
per distinct label set, because a labelled `inc()` per node would cost more than the scoring
itself at 5000 nodes. The counts of one request are kept as a `VerdictTally` (label children
already bound).
"""

from __future__ import annotations

from collections import Counter as _Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from exporter_scheduler.serving.wire import WireErrorCause
from exporter_scheduler.threadcpu import ThreadCpuCollector

Verb = Literal["filter", "prioritize", "explain"]


class VerdictLike(Protocol):
    """The parts of a node verdict the counters read."""

    @property
    def passed(self) -> bool: ...

    @property
    def unresolvable(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def data_status(self) -> str: ...


# The handler takes tens of microseconds for a few nodes and tens of milliseconds for thousands:
# buckets from 50 us to 250 ms cover both ends with about two buckets per octave of interest.
# The coarse ones from 0.5 s reach kube-scheduler's extender timeouts (the chart's 2 s, the
# default 30 s), so that an alert on a p99 near the timeout can see it: `histogram_quantile`
# never reports more than the largest finite bucket.
LATENCY_BUCKETS_S: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# A watch event costs tens of microseconds per active pod class.
EVENT_BUCKETS_S: Final = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01)
NODE_COUNT_BUCKETS: Final = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


@dataclass(frozen=True, slots=True)
class VerdictTally:
    """One request's verdict counts, as increments of bound counter children."""

    increments: tuple[tuple[Counter, int], ...]
    nodes: int
    rejected: int = 0  # failed or unresolvable
    unresolvable: int = 0


VERBS: Final[tuple[Verb, ...]] = ("filter", "prioritize", "explain")
# Label values created at zero, so that `increase()` sees the first error too (a series born at 1
# has no earlier sample to increase from) and dashboards show zeros rather than no data.
ERROR_VERBS: Final = (*VERBS, "other")
REJECT_CAUSES: Final = (*get_args(WireErrorCause), "names_without_node_cache", "body_too_large")
WATCH_RESTART_CAUSES: Final = ("timeout", "expired", "error")


class ScorerMetrics:
    """Every metric the scorer exports; `render()` gives the exposition body and its type."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # First, so that a scrape reads the threads' clocks before the collectors that judge
        # every node (`NodeDataCollector`) spend the scrape's own CPU.
        r.register(ThreadCpuCollector())
        self.request_seconds = Histogram(
            "gpu_scorer_request_duration_seconds",
            "Time spent handling an extender request (decode, evaluate, encode), by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.requests_by_profile = Counter(
            "gpu_scorer_requests",
            "Extender requests answered with verdicts, by verb and by the tenant profile the "
            "pod's namespace chose (`default`: the top-level policy).",
            ["verb", "profile"],
            registry=r,
        )
        self.nodes_per_request = Histogram(
            "gpu_scorer_request_nodes",
            "Nodes in an extender request, by verb.",
            ["verb"],
            buckets=NODE_COUNT_BUCKETS,
            registry=r,
        )
        self.verdicts = Counter(
            "gpu_scorer_filter_verdicts",
            "Filter verdicts per node, by outcome (passed, failed, unresolvable) and reason.",
            ["outcome", "reason"],
            registry=r,
        )
        self.node_data = Counter(
            "gpu_scorer_node_data",
            "Nodes evaluated, by the state of their GPU data (fresh, stale, missing, ...).",
            ["status"],
            registry=r,
        )
        self.bad_requests = Counter(
            "gpu_scorer_rejected_requests",
            "Requests answered with an error status, by cause.",
            ["cause"],
            registry=r,
        )
        self.internal_errors = Counter(
            "gpu_scorer_internal_errors",
            "Requests whose evaluation raised; answered with a defined fallback, by verb.",
            ["verb"],
            registry=r,
        )
        self.unready_requests = Counter(
            "gpu_scorer_unready_requests",
            "Names-only requests answered before the node cache's first LIST (filter with "
            "Error, prioritize with neutral scores), by verb.",
            ["verb"],
            registry=r,
        )
        self.request_path_judgements = Counter(
            "gpu_scorer_request_path_judgements",
            "Nodes a names-only request judged itself instead of finding the node cache's "
            "verdict current (a new pod class, a node not asked about before for it, a verdict "
            "whose time window had just ended), by verb.",
            ["verb"],
            registry=r,
        )
        self.node_cache_size = Gauge(
            "gpu_scorer_node_cache_nodes",
            "Nodes held by the names-only node cache.",
            registry=r,
        )
        self.node_cache_relists = Counter(
            "gpu_scorer_node_cache_relists",
            "Full LISTs of Nodes made by the node cache (the first one included).",
            registry=r,
        )
        self.node_cache_watch_restarts = Counter(
            "gpu_scorer_node_cache_watch_restarts",
            "Node watches that ended (timeout, 410 Gone, connection error) and were reopened.",
            ["cause"],
            registry=r,
        )
        self.node_cache_event_seconds = Histogram(
            "gpu_scorer_node_cache_event_seconds",
            "Time the node cache spent on one watch event: decoding the Node and judging it "
            "for every active pod class.",
            buckets=EVENT_BUCKETS_S,
            registry=r,
        )
        self.node_cache_ready = Gauge(
            "gpu_scorer_node_cache_ready",
            "1 once the node cache holds its first full LIST.",
            registry=r,
        )

        self.pod_cache_pods = Gauge(
            "gpu_scorer_pod_cache_pods",
            "GPU pods bound to nodes held by the pod watch (in-flight or not).",
            registry=r,
        )
        self.pod_cache_relists = Counter(
            "gpu_scorer_pod_cache_relists",
            "Full LISTs of bound GPU pods made by the pod watch (the first one included).",
            registry=r,
        )
        self.pod_cache_watch_restarts = Counter(
            "gpu_scorer_pod_cache_watch_restarts",
            "Pod watches that ended (timeout, 410 Gone, connection error) and were reopened.",
            ["cause"],
            registry=r,
        )
        self.pod_cache_event_seconds = Histogram(
            "gpu_scorer_pod_cache_event_seconds",
            "Time the pod watch spent on one event that changed a node's bound pods: decoding "
            "the Pod and judging its node again for every active pod class.",
            buckets=EVENT_BUCKETS_S,
            registry=r,
        )
        self.pod_cache_ready = Gauge(
            "gpu_scorer_pod_cache_ready",
            "1 once the pod watch holds its first full LIST.",
            registry=r,
        )
        self.nominated_pod_cache_relists = Counter(
            "gpu_scorer_nominated_pod_cache_relists",
            "Full LISTs of nominated, unbound GPU pods made by the second pod watch.",
            registry=r,
        )
        self.nominated_pod_cache_watch_restarts = Counter(
            "gpu_scorer_nominated_pod_cache_watch_restarts",
            "Nominated-pod watches that ended (timeout, 410 Gone, connection error) and were "
            "reopened.",
            ["cause"],
            registry=r,
        )
        self.nominated_pod_cache_event_seconds = Histogram(
            "gpu_scorer_nominated_pod_cache_event_seconds",
            "Time the nominated-pod watch spent on one event that changed a node's nominated "
            "pods, judging the node again included.",
            buckets=EVENT_BUCKETS_S,
            registry=r,
        )
        self.nominated_pod_cache_ready = Gauge(
            "gpu_scorer_nominated_pod_cache_ready",
            "1 once the nominated-pod watch holds its first full LIST.",
            registry=r,
        )
        self.inflight_accounting = Gauge(
            "gpu_scorer_inflight_accounting",
            "1 while pods bound since a node's last measurement are counted in its verdicts "
            "(the pod watch is synced); 0 while they are not (no pod RBAC, the watch down, or "
            "--no-pod-watch): verdicts then read the nodes' annotations alone.",
            registry=r,
        )

        self.namespace_cache_relists = Counter(
            "gpu_scorer_namespace_cache_relists",
            "Full LISTs of Namespaces (tenant profiles chosen by namespace labels only).",
            registry=r,
        )
        self.namespace_cache_watch_restarts = Counter(
            "gpu_scorer_namespace_cache_watch_restarts",
            "Namespace watches that ended (timeout, 410 Gone, connection error) and were reopened.",
            ["cause"],
            registry=r,
        )
        self.namespace_cache_event_seconds = Histogram(
            "gpu_scorer_namespace_cache_event_seconds",
            "Time the namespace watch spent on one event that changed a namespace's labels.",
            buckets=EVENT_BUCKETS_S,
            registry=r,
        )
        self.namespace_cache_ready = Gauge(
            "gpu_scorer_namespace_cache_ready",
            "1 once the namespace watch holds its first full LIST (profiles chosen by labels).",
            registry=r,
        )
        # The DRA watch (DRA pods' verdicts): ResourceClaims, their templates, DeviceTaintRules.
        for kind, what in (
            ("claim", "ResourceClaims"),
            ("claim_template", "ResourceClaimTemplates"),
            ("taint_rule", "DeviceTaintRules"),
        ):
            setattr(
                self,
                f"{kind}_cache_relists",
                Counter(f"gpu_scorer_{kind}_cache_relists", f"Full LISTs of {what}.", registry=r),
            )
            setattr(
                self,
                f"{kind}_cache_watch_restarts",
                Counter(
                    f"gpu_scorer_{kind}_cache_watch_restarts",
                    f"{what} watches that ended and were reopened.",
                    ["cause"],
                    registry=r,
                ),
            )
            setattr(
                self,
                f"{kind}_cache_event_seconds",
                Histogram(
                    f"gpu_scorer_{kind}_cache_event_seconds",
                    f"Time the {what} watch spent on one event that changed what it keeps.",
                    buckets=EVENT_BUCKETS_S,
                    registry=r,
                ),
            )
            setattr(
                self,
                f"{kind}_cache_ready",
                Gauge(
                    f"gpu_scorer_{kind}_cache_ready",
                    f"1 once the {what} watch holds its first full LIST.",
                    registry=r,
                ),
            )

        # Bound children for the request path: `labels()` takes a lock and builds a key per call.
        self.request_seconds_by_verb = {v: self.request_seconds.labels(v) for v in VERBS}
        self._profile_children: dict[tuple[str, str], Counter] = {}
        self.nodes_per_request_by_verb = {v: self.nodes_per_request.labels(v) for v in VERBS}
        self.request_path_judgements_by_verb = {
            v: self.request_path_judgements.labels(v) for v in VERBS
        }
        for verb in ERROR_VERBS:
            self.internal_errors.labels(verb)
        for verb in VERBS:
            self.unready_requests.labels(verb)
        for cause in REJECT_CAUSES:
            self.bad_requests.labels(cause)
        for cause in WATCH_RESTART_CAUSES:
            self.node_cache_watch_restarts.labels(cause)
            self.pod_cache_watch_restarts.labels(cause)
            self.nominated_pod_cache_watch_restarts.labels(cause)
            self.namespace_cache_watch_restarts.labels(cause)
            self.claim_cache_watch_restarts.labels(cause)  # type: ignore[attr-defined]
            self.claim_template_cache_watch_restarts.labels(cause)  # type: ignore[attr-defined]
            self.taint_rule_cache_watch_restarts.labels(cause)  # type: ignore[attr-defined]
        self._verdict_children: dict[tuple[str, str], Counter] = {}
        self._status_children: dict[str, Counter] = {}

    def count_request(self, verb: str, profile: str) -> None:
        child = self._profile_children.get((verb, profile))
        if child is None:
            child = self._profile_children[verb, profile] = self.requests_by_profile.labels(
                verb, profile
            )
        child.inc()

    def observe_request(self, verb: Verb, seconds: float, nodes: int) -> None:
        """One extender call's time to its reply, and the nodes it named."""
        self.request_seconds_by_verb[verb].observe(seconds)
        self.nodes_per_request_by_verb[verb].observe(nodes)

    def tally_verdicts(self, verdicts: Iterable[VerdictLike]) -> VerdictTally:
        """Count one request's verdicts (one pass over the nodes) without adding them yet."""
        return self.tally_counts(
            _Tally((v.passed, v.unresolvable, v.reason, v.data_status) for v in verdicts)
        )

    def tally_counts(self, tally: Mapping[tuple[bool, bool, str | None, str], int]) -> VerdictTally:
        """`tally_verdicts` from node counts per `(passed, unresolvable, reason, data_status)`."""
        by_label: dict[tuple[str, str], int] = {}
        by_status: dict[str, int] = {}
        nodes = rejected = unresolvable_count = 0
        for (passed, unresolvable, reason, status), count in tally.items():
            outcome = "passed" if passed else "unresolvable" if unresolvable else "failed"
            if not passed:
                rejected += count
                unresolvable_count += count if unresolvable else 0
            label = (outcome, reason or "")
            by_label[label] = by_label.get(label, 0) + count
            by_status[status] = by_status.get(status, 0) + count
            nodes += count
        increments = [(self._verdict_child(label), n) for label, n in sorted(by_label.items())]
        increments += [(self._status_child(s), n) for s, n in sorted(by_status.items())]
        return VerdictTally(tuple(increments), nodes, rejected, unresolvable_count)

    def add_tally(self, tally: VerdictTally) -> None:
        for child, count in tally.increments:
            child.inc(count)

    def observe_verdicts(self, verdicts: Iterable[VerdictLike]) -> None:
        """Count one request's verdicts: one pass over the nodes, one `inc` per label set."""
        self.add_tally(self.tally_verdicts(verdicts))

    def _verdict_child(self, label: tuple[str, str]) -> Counter:
        child = self._verdict_children.get(label)
        if child is None:
            child = self._verdict_children[label] = self.verdicts.labels(*label)
        return child

    def _status_child(self, status: str) -> Counter:
        child = self._status_children.get(status)
        if child is None:
            child = self._status_children[status] = self.node_data.labels(status)
        return child

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
