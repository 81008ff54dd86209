"""`gpu-agent`: the command line of the node agent.

`gpu-agent once` samples once and prints the annotations and the merge patch (writing them unless
`--dry-run`); `gpu-agent run` is the daemon. Both take every setting as a flag, generated from
`agent.settings.AgentSettings` so flags, environment variables and docs cannot drift apart.

Exit codes: 0 done (or stopped by SIGTERM/SIGINT); 1 a `once` write failed; 2 bad settings, a GPU
source that cannot start (NVML missing, driver not loaded) or no API configuration, so the
kubelet backs off instead of restarting a pod that cannot work.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
import time
import types
import typing
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

from agent.cgroups import OwnerResolver, read_cgroup_file
from agent.daemon import (
    Agent,
    AllocationSource,
    TickLoop,
    random_fraction,
    run_until_signalled,
    start_jitter_s,
    stop_on_signals,
)
from agent.dra_api import DraClient
from agent.http import HealthServer
from agent.kube import (
    ApiError,
    CredentialsMissingError,
    NodeAnnotator,
    Timeouts,
    api_client_for,
)
from agent.limiter import heartbeat_lead_s
from agent.metrics import AgentMetrics
from agent.settings import (
    RENAMED,
    AgentSettings,
    SettingsError,
    env_names,
    flag_name,
    load_settings,
)
from agent.sources import GpuSource, SourceUnavailable, open_source
from agent.tainter import DeviceTainter
from gpu_contract.schema import merge_patch

log = logging.getLogger("agent")

EXIT_OK = 0
EXIT_WRITE_FAILED = 1
EXIT_CONFIG = 2
_LOG_HANDLER = "gpu-agent"


def _flag_type(annotation: Any) -> tuple[Any, Sequence[str] | None]:
    """The argparse type and choices for a settings field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if annotation in (int, float, str):
        return annotation, None
    return str, None


# What a flag's value is, by the unit its setting's name ends in.
_METAVARS: Final = {"s": "seconds", "c": "celsius"}


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; unset flags stay absent so the environment and defaults apply."""
    group = parser.add_argument_group("settings (each also an environment variable)")
    for name, info in AgentSettings.model_fields.items():
        kind, choices = _flag_type(info.annotation)
        unit = name.split("_")[-1]
        envs = env_names(name)
        old = RENAMED.get(name)
        if old is None:
            where = f"env: {', '.join(envs)}; default: {info.default}"
        else:
            where = (
                f"env: {envs[0]}; default: {info.default}; deprecated: {flag_name(old)}, {envs[1]}"
            )
        # The old spelling of a renamed setting: accepted, not shown.
        for flag in (flag_name(name), *(() if old is None else (flag_name(old),))):
            group.add_argument(
                flag,
                dest=name,
                type=kind,
                choices=choices,
                default=argparse.SUPPRESS,
                metavar=None if choices else _METAVARS.get(unit, unit).upper(),
                help=f"{info.description} [{where}]"
                if flag == flag_name(name)
                else argparse.SUPPRESS,
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-agent",
        description="Publish this node's live GPU state as rate-limited Node annotations.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    once = commands.add_parser(
        "once", help="sample once, print the annotations and the patch (and write it)"
    )
    once.add_argument(
        "--dry-run", action="store_true", help="make no API call; only print what would be sent"
    )
    once.add_argument("--output", choices=("text", "json"), default="text", help="output format")
    add_settings_flags(once)
    run = commands.add_parser("run", help="run the agent daemon")
    add_settings_flags(run)
    return parser


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: AgentSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.set_name(_LOG_HANDLER)
    root = logging.getLogger()
    # Replace only our own handler, so calling main() twice (tests) neither doubles lines nor
    # removes handlers others installed.
    for existing in [h for h in root.handlers if h.get_name() == _LOG_HANDLER]:
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(settings.log_level_number())
    # The scheduler logs every run at INFO; keep only its warnings (skipped runs, misfires).
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))


def _fail(message: str) -> int:
    print(f"gpu-agent: {message}", file=sys.stderr)
    return EXIT_CONFIG


def _open(settings: AgentSettings) -> GpuSource:
    return open_source(
        settings.source,
        simulated_gpus=settings.simulated_gpus,
        simulated_model=settings.simulated_model,
        seed=settings.seed,
        lose_gpu_after_s=settings.simulated_lose_gpu_after,
        processes=settings.process_attribution,
        simulated_pods=settings.simulated_pods,
    )


def _process_owners(settings: AgentSettings, writer: NodeAnnotator | None) -> OwnerResolver | None:
    """Processes to pods: cgroups under --proc-root, pod names from the API (needs a writer)."""
    if not settings.process_attribution or writer is None:
        return None
    proc_root = settings.proc_root
    return OwnerResolver(
        read_cgroup=lambda pid: read_cgroup_file(proc_root, pid), list_pods=writer.pods_by_uid
    )


def _allocations(settings: AgentSettings) -> AllocationSource | None:
    if not settings.pod_resources:
        return None
    # Imported here so that an agent with --pod-resources=false never loads grpc (about 15 MB of
    # resident memory, docs/agent.md "Footprint").
    from agent.podresources import PodResourcesClient  # noqa: PLC0415

    return PodResourcesClient(
        settings.pod_resources_socket, timeout_s=settings.pod_resources_timeout
    )


def _allocation_budget_s(settings: AgentSettings) -> float:
    """The longest the kubelet calls of one tick may take (two calls, each with its timeout)."""
    return 2 * settings.pod_resources_timeout if settings.pod_resources else 0.0


_MISSING_NODE = (
    "no node name: set --node-name, GPU_AGENT_NODE_NAME or NODE_NAME "
    "(the chart sets NODE_NAME from the pod's spec.nodeName)"
)


def cmd_once(args: argparse.Namespace, settings: AgentSettings) -> int:
    if not args.dry_run and not settings.node_name:
        return _fail(_MISSING_NODE)
    try:
        source = _open(settings)
    except SourceUnavailable as exc:
        return _fail(str(exc))
    writer = None
    allocations = _allocations(settings)
    try:
        if not args.dry_run:
            try:
                api = api_client_for(settings.kubeconfig)
            except CredentialsMissingError as exc:
                return _fail(str(exc))
            writer = NodeAnnotator(
                api,
                node_name=settings.node_name or "",
                keys=settings.keys(),
                timeouts=Timeouts(read_s=settings.api_timeout),
            )
        agent = Agent(
            source=source,
            writer=writer,
            policy=settings.write_policy(),
            keys=settings.keys(),
            sample_interval_s=settings.sample_interval_s,
            start_s=time.monotonic(),
            allocations=allocations,
            process_owners=_process_owners(settings, writer),
        )
        result = agent.tick(now_s=time.monotonic(), wall_now=datetime.now(UTC))
        if writer is not None:
            patch = writer.patch_body(result.annotations)
        else:
            patch = merge_patch(result.annotations, settings.keys())
    finally:
        source.close()
        if writer is not None:
            writer.close()
        if allocations is not None:
            allocations.close()

    error = None if result.write_error is None else str(result.write_error)
    if args.output == "json":
        document = {
            "node": settings.node_name or socket.gethostname(),
            "health": result.state.health.value,
            "annotations": result.annotations,
            "patch": patch,
            "dry_run": bool(args.dry_run),
            "written": result.written,
            "error": error,
        }
        print(json.dumps(document, indent=2))
    else:
        print(f"# node {settings.node_name or socket.gethostname()}: {result.state.health.value}")
        for key, value in result.annotations.items():
            print(f"{key}={value}")
        print("# merge patch (application/merge-patch+json):")
        print(json.dumps(patch, indent=2))
        if args.dry_run:
            print("# dry run: nothing written")
        elif result.written:
            print("# written")
        else:
            print(f"# write failed: {error}")
    if not args.dry_run and not result.written:
        return EXIT_WRITE_FAILED
    return EXIT_OK


def cmd_run(settings: AgentSettings) -> int:
    if not settings.node_name:
        return _fail(_MISSING_NODE)
    stop = threading.Event()
    with stop_on_signals(stop):
        return _run(settings, settings.node_name, stop)


def _tainter(
    settings: AgentSettings,
    api: Any,
    *,
    node_name: str,
    metrics: AgentMetrics,
    timeouts: Timeouts,
) -> DeviceTainter | None:
    if not settings.dra_taints:
        log.info("DRA device taints off (--dra-taints false)")
        return None
    return DeviceTainter(
        DraClient(api, node_name=node_name, timeouts=timeouts),
        node_name=node_name,
        driver=settings.dra_driver,
        prefix=settings.annotation_prefix,
        policy=settings.taint_policy(),
        metrics=metrics,
        resync_interval_s=settings.dra_resync_interval,
    )


def _run(settings: AgentSettings, node_name: str, stop: threading.Event) -> int:
    try:
        api = api_client_for(settings.kubeconfig)
    except CredentialsMissingError as exc:
        return _fail(str(exc))
    try:
        source = _open(settings)
    except SourceUnavailable as exc:
        api.close()
        return _fail(str(exc))

    timeouts = Timeouts(read_s=settings.api_timeout)
    writer = NodeAnnotator(api, node_name=node_name, keys=settings.keys(), timeouts=timeouts)
    try:
        writer.refresh()
    except ApiError as exc:
        # Not fatal: the first write re-reads the Node, with backoff.
        log.warning("could not read node %r at start: %s", node_name, exc)

    metrics = AgentMetrics()
    allocations = _allocations(settings)
    seed = settings.seed if settings.source == "simulated" else None
    jitter_s = start_jitter_s(seed=seed, max_s=settings.min_write_interval_s)
    policy = settings.write_policy()
    agent = Agent(
        source=source,
        writer=writer,
        policy=policy,
        keys=settings.keys(),
        metrics=metrics,
        sample_interval_s=settings.sample_interval_s,
        start_s=time.monotonic(),
        jitter_s=jitter_s,
        heartbeat_lead_s=heartbeat_lead_s(policy=policy, fraction=random_fraction(seed=seed)),
        # A tick may also list the node's pods once (naming a new pod's processes).
        request_budget_s=(timeouts.connect_s + timeouts.read_s)
        * (2 if settings.process_attribution else 1)
        + _allocation_budget_s(settings),
        allocations=allocations,
        tainter=_tainter(settings, api, node_name=node_name, metrics=metrics, timeouts=timeouts),
        process_owners=_process_owners(settings, writer),
    )
    server = None
    if settings.metrics_port:
        try:
            server = HealthServer(
                registry=metrics.registry,
                healthz=lambda: agent.healthz(time.monotonic()),
                readyz=agent.readyz,
                host=settings.metrics_address,
                port=settings.metrics_port,
            ).start()
        except OSError as exc:
            source.close()
            writer.close()
            if allocations is not None:
                allocations.close()
            return _fail(
                f"cannot serve metrics on {settings.metrics_address}:{settings.metrics_port} "
                f"(--metrics-port / GPU_AGENT_METRICS_PORT; 0 turns it off): {exc}"
            )
    log.info(
        "gpu-agent started: node %s, source %s, sample every %gs, write at most every %gs "
        "and at least every %gs, first write after %.1fs jitter, metrics %s, allocations %s",
        node_name,
        settings.source,
        settings.sample_interval_s,
        settings.min_write_interval_s,
        settings.heartbeat_s,
        jitter_s,
        f"on port {server.port}" if server else "off",
        f"from {settings.pod_resources_socket}" if allocations is not None else "off",
    )

    def on_stop() -> None:
        source.close()
        if server is not None:
            server.stop()
        writer.close()
        if allocations is not None:
            allocations.close()
        log.info("gpu-agent stopped")

    run_until_signalled(
        TickLoop(agent, interval_s=settings.sample_interval_s), on_stop=on_stop, stop_event=stop
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {
        name: getattr(args, name) for name in AgentSettings.model_fields if hasattr(args, name)
    }
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        return _fail(str(exc))
    configure_logging(settings)
    if args.command == "once":
        return cmd_once(args, settings)
    return cmd_run(settings)
