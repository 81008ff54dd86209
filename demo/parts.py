"""The demo's parts, started for real on loopback: the API stand-in, one agent per node, the scorer.

Each `start_*` function starts one part and registers how to stop it on a `Running` list, so the
demo (and its tests) can undo everything in reverse order after any failure or Ctrl-C. Nothing
here reimplements a part: the agents are `agent.daemon.Agent` on its own `TickLoop`, writing with
`agent.kube.NodeAnnotator` (the real kubernetes client over HTTP); the scorer is the real server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from agent.daemon import Agent, TickLoop, start_jitter_s
from agent.kube import NodeAnnotator, api_client_for
from agent.limiter import WritePolicy
from agent.simulated import SimulatedSource
from demo.options import DemoOptions, NodePlan
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges.nodecache import NodeCache
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving.app import ScorerApp
from gpu_contract.schema import DEFAULT_PREFIX, Field, normalize_model_name
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node
from kube_standins.scheduler_driver import PodSpec

# GPU memory a pod's work holds per GPU when it states no `min-gpu-memory-mib`.
DEFAULT_POD_MEMORY_MIB_PER_GPU = 8 * 1024


class Running(Protocol):
    @property
    def stops(self) -> list[Callable[[], None]]: ...


class ClusterView(Protocol):
    """What the demo reads of its cluster: the stand-in or the real control plane."""

    @property
    def url(self) -> str: ...

    def nodes(self) -> list[dict[str, Any]]: ...

    def node_writes(self, name: str) -> int: ...


# ----------------------------------------------------------------------------------------------
# API stand-in


def start_apiserver(plans: Sequence[NodePlan], *, token: str, running: Running) -> ApiServerStandIn:
    """The local API stand-in, holding one realistic GPU Node per plan."""
    api = ApiServerStandIn(token=token)
    for plan in plans:
        # Node labels spell the product as GPU Feature Discovery does (spaces as `-`).
        product = normalize_model_name(plan.product)
        api.put_node(gpu_node(plan.name, gpu_count=plan.gpus, product=product))
    api.start()
    running.stops.append(api.stop)
    return api


# ----------------------------------------------------------------------------------------------
# Agents


@dataclass(slots=True)
class DemoAgent:
    """One node's real agent and the handles the demo reads."""

    node_name: str
    agent: Agent
    source: SimulatedSource
    loop: TickLoop

    def samples(self) -> int:
        return int(self.agent.metrics.value("gpu_agent_samples_total"))


def start_agents(
    plans: Sequence[NodePlan], *, kubeconfig: Path, options: DemoOptions, running: Running
) -> list[DemoAgent]:
    """One agent per node, each on its own tick loop, writing through its own API client."""
    policy = WritePolicy(
        min_write_interval_s=options.min_write_interval_s,
        heartbeat_s=options.heartbeat_s,
        backoff_base_s=options.min_write_interval_s,
        backoff_max_s=max(options.heartbeat_s, options.min_write_interval_s),
    )
    agents: list[DemoAgent] = []
    for index, plan in enumerate(plans):
        source = SimulatedSource(
            gpus=plan.gpus, model=plan.product, seed=options.seed * 1000 + index
        )
        writer = NodeAnnotator(api_client_for(str(kubeconfig)), node_name=plan.name)
        running.stops.append(writer.close)
        agent = Agent(
            source=source,
            writer=writer,
            policy=policy,
            sample_interval_s=options.sample_interval_s,
            start_s=time.monotonic(),
            jitter_s=start_jitter_s(
                seed=options.seed * 1000 + index, max_s=options.min_write_interval_s
            ),
        )
        loop = TickLoop(agent, interval_s=options.sample_interval_s)
        agents.append(DemoAgent(plan.name, agent, source, loop))
    for demo_agent in agents:
        demo_agent.loop.start()
        running.stops.append(demo_agent.loop.stop)
    return agents


def wait_for_first_writes(api: ClusterView, names: Sequence[str], *, timeout_s: float) -> bool:
    """Block until every node carries the agent's annotations (a DaemonSet's steady state)."""
    deadline = time.monotonic() + timeout_s
    key = DEFAULT_PREFIX + Field.UPDATED_AT.value
    while time.monotonic() < deadline:
        nodes = {str(n["metadata"]["name"]): n for n in api.nodes()}
        if all(
            key in (nodes.get(name, {}).get("metadata", {}).get("annotations") or {})
            for name in names
        ):
            return True
        time.sleep(0.05)
    return False


def _utc_now() -> datetime:
    return datetime.now(UTC)


class SimulatedLoad:
    """Turns the pods bound to a node into load on that node's simulated GPUs.

    A pod on `g` of the node's `n` GPUs at busy fraction `u` adds `g * u / n` to the node's mean
    utilization (the source spreads pushed load evenly over its GPUs) and its memory to the GPUs
    with the most free memory.
    """

    def __init__(
        self, sources: Mapping[str, SimulatedSource], *, clock: Callable[[], datetime] = _utc_now
    ) -> None:
        self._sources = dict(sources)
        self._clock = clock
        self._pods: dict[str, dict[str, PodSpec]] = {name: {} for name in self._sources}
        self._lock = threading.Lock()

    def pod_started(self, node: str, pod: PodSpec) -> None:
        with self._lock:
            self._pods.setdefault(node, {})[pod.name] = pod
            self._push(node)

    def pod_ended(self, node: str, pod: PodSpec) -> None:
        with self._lock:
            self._pods.setdefault(node, {}).pop(pod.name, None)
            self._push(node)

    def _push(self, node: str) -> None:
        source = self._sources.get(node)
        if source is None:
            return
        pods = self._pods[node].values()
        gpus = max(1, source.gpus)
        extra = sum(p.gpus * p.utilization for p in pods) / gpus
        memory = sum(p.gpus * pod_memory_mib_per_gpu(p) for p in pods)
        source.set_load(min(1.0, extra), memory, now=self._clock())


def pod_memory_mib_per_gpu(pod: PodSpec) -> int:
    hinted = pod.hint("min-gpu-memory-mib")
    if hinted and hinted.isdigit():
        return int(hinted)
    return DEFAULT_POD_MEMORY_MIB_PER_GPU


# ----------------------------------------------------------------------------------------------
# Scorer


def start_scorer(
    *, node_cache: bool, kubeconfig: Path, stale_after_s: float, running: Running
) -> str:
    """The real scorer's HTTP server on 127.0.0.1 with an OS-chosen port; returns its base URL.

    `stale_after_s` follows the demo's faster heartbeat (3 x, as the production defaults are).
    """
    policy = Policy(stale_after_s=stale_after_s)
    store = None
    if node_cache:
        store = start_node_cache(kubeconfig=kubeconfig, policy=policy, running=running).store
    app = ScorerApp(policy=policy, node_store=store)
    server = HttpServer(app, host="127.0.0.1", port=0).start()
    running.stops.append(server.stop)
    return server.url


def start_node_cache(*, kubeconfig: Path, policy: Policy, running: Running) -> NodeCache:
    """The scorer's own list+watch of Nodes, as `gpu-scorer serve --node-cache` runs it.

    Waits for the first LIST, as the scorer's `/readyz` does before the scheduler may call it.
    """
    cache = NodeCache(kubeconfig=str(kubeconfig), keys=policy.keys)
    cache.start()
    running.stops.append(cache.stop)
    if not cache.wait_until(lambda c: c.ready(), timeout_s=10.0):
        raise RuntimeError("the scorer's node cache did not finish its first LIST in 10 s")
    return cache
