"""The extender's request path: one body in, one reply out, in four stages and with no I/O.

    decode (wire)  ->  pod class (podclass.PodClass, compiled once per class)
                   ->  verdicts: full nodes: `evaluate`; names only: the node store's entries
                   ->  reply bytes, then the verdict counters and log lines

kube-scheduler waits for every answer, so nothing here waits on anything: node data in
names-only mode is the node store's, kept current by the watch thread, and log records go
through a queue (`logs.configure_logging`). Every input gets a defined answer: an unusable body
400 (413 from the HTTP edge), a bug while judging a fallback 200 that the scheduler can act on
(`filter`: `Error` and no node passing; `prioritize`: neutral scores), a names-only request before
the node cache's first LIST an `Error` rather than a blind verdict.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from itertools import compress
from types import MappingProxyType
from typing import Final
from urllib.parse import parse_qs

import msgspec

from exporter_scheduler.config.profiles import PolicySet, Profile
from exporter_scheduler.config.serving import DEFAULT_MAX_BODY_BYTES
from exporter_scheduler.core.hints import SPREAD_MAX_PER_DOMAIN
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.podclass import PodClass, PodClassKey, pod_class_key
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.core.spread import (
    HOSTNAME_KEY,
    LabelsOf,
    SpreadCap,
    SpreadCheck,
    check_spread,
)
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.contentverdicts import ContentVerdicts
from exporter_scheduler.serving.dra import dra_nodes, dra_pod, dra_reply, exclusions
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.explain import explain, render_text, with_learned_basis
from exporter_scheduler.serving.inputs import (
    DraSource,
    Groups,
    LearnedLoads,
    NamespaceLabels,
    Placements,
)
from exporter_scheduler.serving.logfields import count_and_log
from exporter_scheduler.serving.metrics import ScorerMetrics, Verb
from exporter_scheduler.serving.nodeobjects import gpu_keys, record_input, record_labels
from exporter_scheduler.serving.nodestore import NodeStore
from exporter_scheduler.serving.proposals import proposal, proposes, spread_capped
from exporter_scheduler.serving.responses import (
    TEXT,
    Response,
    Steps,
    bad_request,
    fallback_reply,
    method_not_allowed,
    normalize_path_prefix,
)
from exporter_scheduler.serving.verdicts import Judgement

# Compiled pod classes kept for reuse; beyond this the cache starts afresh (they are cheap).
_MAX_POD_CLASSES: Final = 256
# Replies held at once for their steps (`ScorerApp._hold`): a few per connection in use.
_MAX_HELD: Final = 4096
# Namespaces whose chosen profile is remembered; beyond this the memo starts afresh.
_MAX_NAMESPACES: Final = 4096
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})

NOT_READY_ERROR: Final = "gpu scorer node cache not synced yet (first Node LIST pending)"

Clock = Callable[[], datetime]
PodsOf = Callable[[str], tuple[BoundPod, ...]]

# Without the pod watch a group's pods cannot be counted, and a cap that cannot be counted
# cannot be kept: its pods wait rather than exceed it.
SPREAD_UNCOUNTED: Final = "spread group not counted (pod watch off)"


log = logging.getLogger("exporter_scheduler.server")


def utc_now() -> datetime:
    return datetime.now(UTC)


class ScorerApp:
    """The request path; `respond()` is what the HTTP edge calls, `handle()` one extender call."""

    def __init__(
        self,
        *,
        policy: Policy,
        clock: Clock = utc_now,
        node_store: NodeStore | None = None,
        path_prefix: str = "/",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        metrics: ScorerMetrics | None = None,
        pods_of: PodsOf | None = None,
        placements: Placements | None = None,
        profiles: tuple[Profile, ...] = (),
        namespace_labels: NamespaceLabels | None = None,
        groups: Groups | None = None,
        workloads: LearnedLoads | None = None,
        learn_from_requests: bool = False,
        dra: DraSource | None = None,
        dra_extended_resource: bool = False,
    ) -> None:
        # The top-level policy; a pod whose namespace a tenant profile matches gets that
        # profile's policy instead (`_policy_for`).
        self.policy = policy
        self.policies = PolicySet(policy, profiles)
        self.namespace_labels = namespace_labels
        self.groups = groups
        self._chosen: dict[str, Policy] = {}
        self._chosen_generation = -1
        # Full-node mode: each node's bound GPU pods, from the pod watch (names-only mode has
        # them in the node store). None without a pod watch.
        self.pods_of = pods_of
        # What each workload's running pods use per GPU (serving/workloads.py), learned by the
        # watches; None: no learning (each pod's own load is its hint or the default).
        self.workloads = workloads
        # Full-node mode: the requests' Nodes teach the figures (`observe_requested`).
        self.learn_from_requests = learn_from_requests and workloads is not None
        # Within a burst the next pod's filter can come before the previous pod's bind is in
        # the watch: each decision is recorded as a provisional placement (see inflight.py).
        self.placements = placements
        # DRA pods' claims and device taints (serving/dra.py); None: no DRA watch.
        self.dra, self.dra_extended_resource = dra, dra_extended_resource
        self.clock = clock
        self.node_store = node_store
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        self._classes: dict[PodClassKey, PodClass] = {}
        self._full_node_verdicts = ContentVerdicts()
        self._prioritizes = False  # a prioritize came: each names-only filter prepares its own
        self._recent_pod = wire.RecentPod()
        # Replies with a step for right after them, until they are finished: a request on
        # another connection runs their first steps (`_prepare_earlier`) and a scrape their
        # counters (`settle`). Each one's last step takes it out, so that nothing here keeps a
        # written reply (nor the request body its parts may slice). A plain dict keyed in
        # order: a weak set ran Python-level code for every request (its length, its iteration).
        self._held: dict[int, Response] = {}
        self._held_keys = itertools.count()
        self._held_lock = threading.Lock()
        prefix = normalize_path_prefix(path_prefix)
        self._verbs: dict[str, Verb] = {
            f"{prefix}/filter": "filter",
            f"{prefix}/prioritize": "prioritize",
            f"{prefix}/explain": "explain",
        }

    # ------------------------------------------------------------------ routes
    def respond(self, method: str, path: str, query: bytes, body: Buffer) -> Response:
        """Any HTTP request, routed; never raises. The caller calls the answer's `finish()` once
        the reply is written (the call's counters and log lines)."""
        verb = self._verbs.get(path)
        try:
            if method == "POST" and verb is not None:
                return self.answer(verb, body, query=query)
            return self.handle_get(method, path)
        except Exception as exc:  # a bug outside the verdicts: still a defined answer, not a 500
            return self._unexpected(verb, exc)

    def body_too_large(self) -> Response:
        self.metrics.bad_requests.labels("body_too_large").inc()
        error = f"request body exceeds {self.max_body_bytes} bytes (max-body-bytes)"
        return Response(413, wire.encode_json({"Error": error}))

    def handle_get(self, method: str, path: str) -> Response:
        if path in self._verbs:
            return method_not_allowed("POST")
        if path not in ("/healthz", "/readyz", "/metrics"):
            return Response(404, wire.encode_json({"Error": f"no such path: {path[:200]}"}))
        if method not in ("GET", "HEAD"):
            return method_not_allowed("GET, HEAD")
        if path == "/healthz":
            return Response(200, b"ok\n", TEXT)
        if path == "/readyz":
            if self.node_store is None or self.node_store.ready():
                return Response(200, b"ok\n", TEXT)
            return Response(503, b"node cache has not completed its first list\n", TEXT)
        self.settle()
        body, content_type = self.metrics.render()
        return Response(200, body, content_type.encode())

    def settle(self) -> None:
        """Finish every reply whose counters and log lines are still held."""
        for response in self._held_now():
            response.finish()

    def _held_now(self) -> list[Response]:
        """The replies still held, at this moment (other threads add and release)."""
        with self._held_lock:
            return list(self._held.values())

    def _hold(self, response: Response, steps: Steps) -> None:
        """Keep `response` findable until its last step (`_release`) has run. A caller that
        never finishes its replies (a bug) loses the oldest past `_MAX_HELD`, not memory."""
        key = next(self._held_keys)
        steps.later.append(partial(self._release, key))
        with self._held_lock:
            self._held[key] = response
            if len(self._held) > _MAX_HELD:
                del self._held[next(iter(self._held))]

    def _release(self, key: int) -> None:
        with self._held_lock:
            self._held.pop(key, None)

    # ------------------------------------------------------------------ the pipeline
    def handle(self, verb: Verb, body: Buffer, *, query: bytes = b"") -> Response:
        """Answer one extender call (`filter`, `prioritize` or `explain`) for a request body,
        its counters and log lines included."""
        response = self.answer(verb, body, query=query)
        response.finish()
        return response

    def answer(self, verb: Verb, body: Buffer, *, query: bytes = b"") -> Response:
        """`handle`, leaving the call's counters and log lines to `response.finish()`, which the
        HTTP edge calls once the reply is written: kube-scheduler waits for the reply alone."""
        started = time.perf_counter()
        if self._held:
            self._prepare_earlier()
        steps = Steps()
        request = self._decode(verb, body)
        if isinstance(request, Response):
            return request
        if request.form == "names" and verb != "explain" and not self._store_ready():
            return self._not_ready(verb, request, started)
        now = self.clock()
        try:
            if self.learn_from_requests and request.form == "nodes" and self.workloads is not None:
                self.workloads.observe_requested(request.records, request.keys)
            if self.dra is not None:
                pod = dra_pod(request.pod, self.dra, extended=self.dra_extended_resource)
                request = msgspec.structs.replace(request, pod=pod)
            pod_class = self._pod_class(request, now)
            if verb == "explain":
                response = self._explain(request, pod_class, now, query)
            else:
                placements = self.placements
                if placements is not None and verb == "filter":
                    placements.forget(request.pod.uid)  # scheduled again: it did not bind
                judgement: Judgement | None = None
                if request.form == "names":
                    response, judgement = self._names_reply(verb, request, pod_class, now, steps)
                elif request.pod.dra is not None:
                    response = self._dra_reply(verb, request, pod_class, now)
                else:
                    response, judgement = self._nodes_reply(verb, request, pod_class, now, steps)
                # A DRA pod's devices show in its claim's allocation, written before binding.
                # Recorded right after the reply is written, before the connection's next
                # request is read: kube-scheduler waits for the reply alone.
                if placements is not None and judgement is not None and request.pod.dra is None:
                    steps.first.append(
                        partial(self._propose, verb, request, pod_class, judgement, now, placements)
                    )
                steps.later.append(
                    partial(self.metrics.count_request, verb, pod_class.policy.profile)
                )
        except Exception as exc:
            response = self._internal_error(verb, request, exc)
        seconds = time.perf_counter() - started  # the reply is made: the time is taken here
        steps.later.append(partial(self.metrics.observe_request, verb, seconds, request.node_count))
        if steps.first:
            self._hold(response, steps)
        response.then(steps)
        return response

    def _prepare_earlier(self) -> None:
        """Run what the replies still held left for right after them (`Response.prepare`)
        where their connection has not run it yet: a request on another connection must see
        the proposals they record. On the connection that sent them it has run already, and
        this is a no-op per reply."""
        for response in self._held_now():
            response.prepare()

    def _decode(self, verb: Verb, body: Buffer) -> wire.ExtenderRequest | Response:
        """Stage 1: the body, decoded to what a verdict reads, or the 400 that says why not."""
        try:
            # A prioritize names the pod its filter just decoded.
            request = (
                self._recent_pod.names_request(body, self.policy.keys)
                if verb == "prioritize" and self.node_store is not None
                else None
            ) or wire.decode_args(
                body,
                gpu_resource_name=self.policy.gpu_resource_name,
                keys=self.policy.keys,
                echo=verb == "filter",  # only a filter reply echoes the Nodes
                # The node store knows the names of the lists it has been asked about.
                decode_names=self.node_store is None,
            )
            if verb == "filter":
                self._recent_pod.remember(request)
            if request.form == "names" and self.node_store is not None and not request.node_names:
                known = self.node_store.list_names(request.node_names_json, wire.decode_node_names)
                request = request.with_names(*known)
        except wire.WireError as exc:
            self.metrics.bad_requests.labels(exc.cause).inc()
            return bad_request(verb, str(exc))
        if request.form == "names" and self.node_store is None:
            self.metrics.bad_requests.labels("names_without_node_cache").inc()
            return bad_request(
                verb,
                "the request carries NodeNames (nodeCacheCapable: true) but the scorer runs "
                "without --node-cache",
            )
        return request

    def _policy_for(self, namespace: str) -> Policy:
        """The policy of the first tenant profile matching `namespace` (else the top-level
        one), memoised per namespace until a namespace's labels change."""
        policies = self.policies
        if not policies.profiles:
            return self.policy
        source = self.namespace_labels
        generation = -1 if source is None else source.generation
        if generation != self._chosen_generation:
            self._chosen = {}
            self._chosen_generation = generation
        chosen = self._chosen.get(namespace)
        if chosen is None:
            labels = _NO_LABELS if source is None else source.labels(namespace)
            chosen = policies.choose(namespace, labels)
            if len(self._chosen) > _MAX_NAMESPACES:
                self._chosen = {}
            self._chosen[namespace] = chosen
        return chosen

    def _pod_class(self, request: wire.ExtenderRequest, now: datetime) -> PodClass:
        """Stage 2: the pod's class, compiled once and reused by every pod with the same hints,
        GPU request and learned load under the policy its namespace chose."""
        pod = request.pod
        policy = self._policy_for(pod.namespace)
        workloads = self.workloads
        if workloads is not None and policy.own_load and pod.workload is not None:
            learned = workloads.learned_for(pod.workload, now)
            if learned is not None:
                pod = msgspec.structs.replace(pod, learned=learned)
        known = self._classes.get(pod_class_key(pod, policy))
        if known is not None and known.policy is policy:
            return known
        pod_class = PodClass.of(pod, policy)
        if len(self._classes) >= _MAX_POD_CLASSES:
            self._classes = {}
        self._classes[pod_class.key] = pod_class
        return pod_class

    def _propose(  # noqa: PLR0917 (handle's locals)
        self,
        verb: Verb,
        request: wire.ExtenderRequest,
        pod_class: PodClass,
        judgement: Judgement,
        now: datetime,
        placements: Placements,
    ) -> None:
        """Record where the scheduler is expected to bind the pod (`serving.proposals`)."""
        made = proposal(verb, request, pod_class, judgement, now)
        if made is not None:
            placements.propose(*made, now)

    def _nodes_reply(
        self,
        verb: Verb,
        request: wire.ExtenderRequest,
        pod_class: PodClass,
        now: datetime,
        steps: Steps,
    ) -> tuple[Response, Judgement]:
        """Stages 3 and 4 for full Node objects (or neither list): the verdicts of Nodes seen
        before for this class, the others judged, the chain, the reply."""
        gpu_fields = gpu_keys(request.keys)
        judgement, judged = self._full_node_verdicts.judge(
            pod_class,
            request.records,
            request.node_names,
            now,
            lambda record: record_input(record, gpu_fields),
            pods_of=self._pods_of_at(now),
        )
        judgement.block(self._spread(request, pod_class)[1])
        if verb == "prioritize":
            return Response(200, judgement.prioritize_reply()), judgement
        failed, unresolvable = judgement.rejections()
        parts = wire.filter_reply_parts(
            request, judgement.passed_mask(), failed=failed, unresolvable=unresolvable
        )
        steps.later.append(
            partial(
                count_and_log, self.metrics, log, _pod_ref(request), pod_class, judgement, judged
            )
        )
        return Response(200, parts), judgement

    def _spread(
        self, request: wire.ExtenderRequest, pod_class: PodClass
    ) -> tuple[SpreadCheck | None, Mapping[str, str]]:
        """The pod's spread cap over the request's nodes: the check (for the explanation) and
        the nodes it rejects (name -> reason), one of the overrides (`core.overrides`).

        The domains of the nodes the group's pods run on come from the node store in
        names-only mode. A full-node request carries only its own Nodes' labels, and a verdict
        depends on the request, the caches and the policy, never on an earlier request: a group
        pod on a node outside the request counts by hostname (that label is the node's name),
        and is otherwise uncounted (the explanation says how many)."""
        if not spread_capped(pod_class):
            return None, _NO_LABELS
        store = self.node_store
        nodes: list[tuple[str, Mapping[str, str] | None]]
        if request.form == "names" and store is not None:
            nodes = [(name, store.labels_of(name)) for name in request.node_names]
            labels_of: LabelsOf = store.labels_of
        else:
            nodes = [(r.metadata.name, record_labels(r)) for r in request.records]
            labels_of = dict(nodes).get
        pod, hints = request.pod, pod_class.hints
        assert hints.spread_max_per_domain is not None
        if pod.spread_group is None:
            prefix = pod_class.policy.keys.prefix
            reason = f"invalid pod annotation {prefix}{SPREAD_MAX_PER_DOMAIN}"
            return None, dict.fromkeys((name for name, _ in nodes), reason)
        groups = self.groups
        if groups is None or not groups.active:
            return None, dict.fromkeys((name for name, _ in nodes), SPREAD_UNCOUNTED)
        cap = SpreadCap(
            pod.namespace,
            pod.spread_group,
            hints.spread_max_per_domain,
            hints.spread_topology_key or HOSTNAME_KEY,
        )
        group_pods = groups.group_pods(pod.namespace, pod.spread_group)
        check = check_spread(cap, group_pods, nodes, labels_of)
        return check, check.blocked

    def _names_reply(
        self,
        verb: Verb,
        request: wire.ExtenderRequest,
        pod_class: PodClass,
        now: datetime,
        steps: Steps,
    ) -> tuple[Response, Judgement]:
        """Stages 3 and 4 for node names: the store's current verdicts, the chain, the bytes."""
        assert self.node_store is not None  # `_decode` answered 400 otherwise
        names, dra, key = request.node_names, request.pod.dra, request.node_names_json
        if dra is not None and self.dra is not None:
            excluded = exclusions(names, self.dra, dra)
            judgement = self.node_store.judge_dra(pod_class, names, excluded, now)
        else:  # both replies read the verdicts' tally indexes alone
            store = self.node_store
            judgement = store.judge(pod_class, names, now, list_key=key, tallies_only=True)
        if judgement.judged:
            self.metrics.request_path_judgements_by_verb[verb].inc(judgement.judged)
        blocked = self._spread(request, pod_class)[1]
        judgement.block(blocked)
        replies = judgement.replies  # made earlier from these same entries, if anything
        body = None if replies is None else replies.bodies.get(verb)
        if body is None:
            if verb == "prioritize":
                body = judgement.prioritize_reply()
            else:
                failed, unresolvable = judgement.rejections()
                passed = list(compress(judgement.names, judgement.passed_mask()))
                body = wire.encode_names_filter_reply(
                    passed, failed=failed, unresolvable=unresolvable
                )
            if replies is not None:
                replies.bodies[verb] = body
        if verb == "prioritize":
            self._prioritizes = True  # kube-scheduler's configuration sends them
            return Response(200, body), judgement
        # kube-scheduler scores (and so prioritizes) only when more than one node is left.
        if dra is None and not blocked and self._prioritizes and judgement.passing() > 1:
            top = self.placements is not None and proposes(request.pod, pod_class)  # recorded
            ahead = partial(self.node_store.judge_ahead, pod_class, judgement, now)
            steps.first.append(partial(ahead, proposes=top))
            steps.awaits_next = True
        # The node store logged the rejected nodes' values when it judged them.
        pod_ref = _pod_ref(request)
        steps.later.append(
            partial(count_and_log, self.metrics, log, pod_ref, pod_class, judgement, ())
        )
        return Response(200, body), judgement

    def _dra_reply(
        self, verb: Verb, request: wire.ExtenderRequest, pod_class: PodClass, now: datetime
    ) -> Response:
        """A DRA pod in full Node objects: judged now on the GPUs the allocator may give it."""
        nodes = self._nodes_of(request, now)
        evaluation = evaluate(
            request.pod, nodes, now, pod_class.policy, pod_class=pod_class,
            blocked=self._spread(request, pod_class)[1],
        )  # fmt: skip
        self.metrics.request_path_judgements_by_verb[verb].inc(len(nodes))
        if verb == "filter":
            self.metrics.observe_verdicts(evaluation.verdicts)
        return Response(200, dra_reply(verb, request, evaluation))

    def _explain(
        self,
        request: wire.ExtenderRequest,
        pod_class: PodClass,
        now: datetime,
        query: bytes,
    ) -> Response:
        nodes = self._nodes_of(request, now)
        spread, blocked = self._spread(request, pod_class)
        evaluation = evaluate(
            request.pod, nodes, now, pod_class.policy, pod_class=pod_class, blocked=blocked
        )
        workload, workloads = request.pod.workload, self.workloads
        learned = None if workloads is None else workloads.learned_for(workload, now)
        document = explain(
            with_learned_basis(evaluation, learned),
            request.pod,
            now,
            pod_class.policy,
            spread=spread,
        )
        output = parse_qs(query.decode("latin-1")).get("output", ["json"])[-1]
        if output == "text":
            return Response(200, render_text(document).encode(), TEXT)
        return Response(200, wire.encode_json(document))

    # ------------------------------------------------------------------ defined fallbacks
    def _store_ready(self) -> bool:
        return self.node_store is not None and self.node_store.ready()

    def _not_ready(self, verb: Verb, request: wire.ExtenderRequest, started: float) -> Response:
        """Names only, before the node cache's first LIST: no answer rather than a blind one.

        Evaluated now, every node would be "missing data": passed blind (lenient) or rejected
        as unresolvable (strict, leaving the pod unschedulable until a cluster change). A
        filter `Error` instead makes the scheduler retry the pod with back-off, by when the
        LIST is in; prioritize (called only after a filter) gives the neutral 0.
        """
        self.metrics.unready_requests.labels(verb).inc()
        if verb == "filter":
            response = Response(200, wire.encode_filter_error(request, NOT_READY_ERROR))
        else:
            response = Response(
                200, wire.encode_prioritize_reply((name, 0) for name in request.node_names)
            )
        self.metrics.observe_request(verb, time.perf_counter() - started, request.node_count)
        return response

    def _nodes_of(self, request: wire.ExtenderRequest, now: datetime) -> Sequence[NodeInput]:
        dra = request.pod.dra
        if request.form == "names" and self.node_store is not None:
            nodes: Sequence[NodeInput] = self.node_store.lookup(request.node_names)
        else:
            pods_of = self._pods_of_at(now)
            if pods_of is None:
                nodes = request.nodes
            else:
                nodes = [msgspec.structs.replace(n, pods=pods_of(n.name)) for n in request.nodes]
        return nodes if dra is None or self.dra is None else dra_nodes(nodes, self.dra, dra)

    def _pods_of_at(self, now: datetime) -> Callable[[str], tuple[BoundPod, ...]] | None:
        """Full-node mode: each node's bound pods, stamped with their workloads' figures."""
        pods_of, workloads = self.pods_of, self.workloads
        if pods_of is None or workloads is None:
            return pods_of
        return workloads.stamped_pods_of(pods_of, now)

    def _unexpected(self, verb: Verb | None, exc: Exception) -> Response:
        """The answer when `handle` itself raised (nothing known of the request)."""
        self.metrics.internal_errors.labels(verb or "other").inc()
        log.error("request failed", exc_info=exc, extra={"fields": {"verb": verb or "other"}})
        return fallback_reply(verb, None, f"gpu scorer internal error: {type(exc).__name__}")

    def _internal_error(
        self, verb: Verb, request: wire.ExtenderRequest, exc: Exception
    ) -> Response:
        self.metrics.internal_errors.labels(verb).inc()
        log.error(
            "evaluation failed",
            exc_info=exc,
            extra={"fields": {"verb": verb, "pod": _pod_ref(request), "nodes": request.node_count}},
        )
        return fallback_reply(verb, request, f"gpu scorer internal error: {type(exc).__name__}")


def _pod_ref(request: wire.ExtenderRequest) -> str:
    return f"{request.pod.namespace}/{request.pod.name}"
