"""`gpu-scorer`: serve the extender, or explain its verdicts for a saved request.

    gpu-scorer serve [--host H] [--port P] [--path-prefix /] [--node-cache] [policy flags]
    gpu-scorer explain --request args.json [--now 2026-11-30T14:00:00Z] [--output text|json]

Every `serve` flag is also a `GPU_SCORER_*` variable (flags win); policy settings may also come
from `--policy-file`. `build_parser()` is public so that deployment manifests can be checked
against the real flag names.
"""

from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
import types
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

from exporter_scheduler.config.profiles import PolicySet
from exporter_scheduler.config.settings import (
    POLICY_FIELDS,
    ScorerSettings,
    SettingsError,
    env_name,
    flag_name,
    load_settings,
    settings_fields,
)
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.heap import CollectorPacing
from exporter_scheduler.logs import configure_logging
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.explain import explain, render_text
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodedata import NodeDataCollector
from exporter_scheduler.serving.nodestore import DEFAULT_MAX_CLASSES
from exporter_scheduler.serving.observability import ObservabilityApp
from exporter_scheduler.serving.workloads import WorkloadLoads
from gpu_contract.schema import Keys, parse_timestamp

PROG = "gpu-scorer"
# Settings `explain` accepts besides the policy: where the policy file is.
_EXPLAIN_EXTRA = ("policy_file",)
_LABEL_SETTINGS = (
    "kubeconfig",
    "policy_file",
    "annotation_prefix",
    "gpu_resource_name",
    "log_level",
)
if TYPE_CHECKING:
    from exporter_scheduler.core.policy import Policy
    from exporter_scheduler.edges.dracache import DraCache
    from exporter_scheduler.edges.namespacecache import NamespaceCache
    from exporter_scheduler.edges.nodecache import NodeCache
    from exporter_scheduler.edges.podcache import PodCache

_NOT_SETTINGS = {"command", "request", "now", "output", "dry_run"}
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_Watch = TypeVar("_Watch")


def _flag_kwargs(name: str, annotation: Any) -> dict[str, Any]:
    """argparse options for a settings field, from its type annotation."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
        origin = get_origin(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"choices": list(get_args(annotation))}
    if annotation is int:
        return {"type": int, "metavar": "N"}
    if annotation is float:
        return {"type": float, "metavar": "X"}
    if annotation is Path:
        return {"metavar": "PATH"}
    return {"metavar": name.upper()}


def _add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    fields = settings_fields()
    for name in names:
        info = fields[name]
        parser.add_argument(
            flag_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            help=f"{info.description} [env {env_name(name)}; default {info.default!r}]",
            **_flag_kwargs(name, info.annotation),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="kube-scheduler extender scoring GPU nodes on live GPU state"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve /filter, /prioritize, /explain over HTTP")
    _add_setting_flags(serve, list(settings_fields()))

    explain_cmd = commands.add_parser(
        "explain", help="print every node's inputs, rules, score and verdict for a request"
    )
    explain_cmd.add_argument(
        "--request", required=True, metavar="PATH", help="ExtenderArgs JSON with full Nodes"
    )
    explain_cmd.add_argument(
        "--now", metavar="RFC3339", help="evaluate at this time (default: the current time)"
    )
    explain_cmd.add_argument(
        "--output",
        choices=["text", "json"],
        default="text",
        help="text for people, json for programs (default: text)",
    )
    _add_setting_flags(explain_cmd, [*POLICY_FIELDS, *_EXPLAIN_EXTRA])

    label_cmd = commands.add_parser(
        "label-gpu-pods",
        help="label the unfinished GPU pods created before the chart's admission policy "
        "(for --pod-label-selector), print one JSON summary line",
    )
    label_cmd.add_argument(
        "--dry-run", action="store_true", help="count the pods it would label, label none"
    )
    _add_setting_flags(label_cmd, list(_LABEL_SETTINGS))
    return parser


def _settings_from(args: argparse.Namespace) -> ScorerSettings:
    flags = {k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS}
    return load_settings(flags)


def _serve(args: argparse.Namespace) -> int:
    settings = _settings_from(args)
    listener = configure_logging(settings.log_level)
    log = logging.getLogger("exporter_scheduler.cli")
    policy = settings.policy()
    metrics = ScorerMetrics()
    cache = None
    pod_cache = None
    namespaces: NamespaceCache | Literal[False] | None = None
    dra: DraCache | None = None
    learning: NodeCache | None = None  # full-node mode's Node watch that only teaches
    policies = settings.policy_set()
    workloads = WorkloadLoads(
        keys_prefix=policy.keys.prefix,
        load_delay_s=policy.inflight_load_delay_s,
        settle_s=settings.own_load_settle_s,
        settle_floor=policy.own_load_gpu_load,
        max_age_s=settings.own_load_max_age_s,
        min_pods=settings.own_load_min_pods,
        max_workloads=settings.own_load_max_workloads,
    )
    # The caches' objects out of the collector's full passes, which stop every request
    # (exporter_scheduler/heap.py).
    pacing = CollectorPacing().start()
    try:
        if settings.node_cache:
            # Imported here so that full-node mode never loads the kubernetes client.
            from exporter_scheduler.edges.nodecache import NodeCache  # noqa: PLC0415

            try:
                cache = NodeCache(
                    kubeconfig=settings.kubeconfig_file(),
                    keys=policy.keys,
                    metrics=metrics,
                    # Each profile's pod classes have verdict tables of their own.
                    max_classes=DEFAULT_MAX_CLASSES * len(policies.policies()),
                    workloads=workloads,
                ).start()
            except Exception as exc:
                log.error("cannot load Kubernetes credentials for --node-cache: %s", exc)
                return 1
            metrics.registry.register(NodeDataCollector(cache, policy))
        elif settings.own_load_node_watch and settings.pod_watch:
            learning = _start_learning_node_watch(settings, policy, metrics, log, workloads)
        pod_cache = _start_pod_watch(settings, metrics, cache, log, workloads)
        namespaces = _start_namespace_watch(settings, policies, metrics, log)
        if namespaces is False:
            return 1
        dra = _start_dra_watch(settings, metrics, log)
        if dra is not None and cache is not None:
            # Claim and taint events judge DRA pods' entries again off the request path.
            dra.data.on_exclusions = cache.store.exclusions_changed
        app = ScorerApp(
            policy=policy,
            node_store=None if cache is None else cache.store,
            path_prefix=settings.path_prefix,
            max_body_bytes=settings.max_body_bytes,
            metrics=metrics,
            # Names-only mode reads the pods from the node store; full-node mode from here.
            pods_of=pod_cache.pods_of if pod_cache is not None and cache is None else None,
            placements=pod_cache,
            groups=pod_cache,
            # Learning needs the pods' workloads (the Pod watch) and the nodes' per-pod usage:
            # from the Node watch in names-only mode, from the requests' Nodes in full-node mode.
            workloads=workloads if pod_cache is not None else None,
            learn_from_requests=cache is None and learning is None,
            profiles=policies.profiles,
            namespace_labels=namespaces,
            dra=None if dra is None else dra.data,
            dra_extended_resource=settings.dra_extended_resource,
        )
        try:
            server = HttpServer(
                app,
                host=settings.host,
                port=settings.port,
                tls=settings.tls(),
                keep_alive_s=settings.keep_alive_s,
            )
            observability = None
            if settings.metrics_port is not None:
                observability = HttpServer(
                    ObservabilityApp(app),
                    host=settings.host,
                    port=settings.metrics_port,
                    thread_name="gpu-scorer-metrics",  # scrapes apart from the scheduler's calls
                )
        except (OSError, ssl.SSLError) as exc:
            log.error("cannot listen on %s: %s", settings.host, exc)
            return 1
        log.info(
            "serving",
            extra={
                "fields": {
                    "host": settings.host,
                    "port": settings.port,
                    "metrics_port": settings.metrics_port,
                    "path_prefix": settings.path_prefix,
                    "mode": "names-only (node cache)" if cache is not None else "full nodes",
                    "tls": settings.tls() is not None,
                }
            },
        )

        # SIGTERM/SIGINT stop accepting and let requests in progress finish; the process then
        # exits normally, after the log queue is flushed.
        def _stop(signum: int, frame: types.FrameType | None) -> None:
            server.request_stop()
            if observability is not None:
                observability.request_stop()

        previous = {sig: signal.signal(sig, _stop) for sig in _STOP_SIGNALS}
        try:
            if observability is not None:
                observability.start()
            server.serve_forever()
            server.stop()
            if observability is not None:
                observability.stop()
            log.info("shutdown complete")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0
    finally:
        if dra is not None:
            dra.stop()
        if namespaces:
            namespaces.stop()
        if pod_cache is not None:
            pod_cache.stop()
        for watch in (cache, learning):
            if watch is not None:
                watch.stop()
        pacing.stop()
        listener.stop()


def _start_learning_node_watch(
    settings: ScorerSettings,
    policy: Policy,
    metrics: ScorerMetrics,
    log: logging.Logger,
    workloads: WorkloadLoads,
) -> NodeCache | None:
    """Full-node mode with --own-load-node-watch: a Node watch whose only reader is the
    workloads' store (verdicts still read the Nodes of each request), started; None without
    credentials, and the Nodes of the requests teach instead (one log line says so)."""
    from exporter_scheduler.edges.nodecache import NodeCache  # noqa: PLC0415

    return _started_or_none(
        lambda: NodeCache(
            kubeconfig=settings.kubeconfig_file(),
            keys=policy.keys,
            metrics=metrics,
            workloads=workloads,
        ).start(),
        log,
        "learning from the requests' Nodes only",
        "the Node watch",
    )


def _started_or_none(
    start: Callable[[], _Watch], log: logging.Logger, without_it: str, watch: str
) -> _Watch | None:
    """`start()`'s watch, or None when it cannot start (no credentials, most often): a watch
    that only improves verdicts never stops the scorer from serving; one warning says what the
    scorer does without it (`without_it`) and why."""
    try:
        return start()
    except Exception as exc:
        log.warning(
            without_it,
            extra={"fields": {"why": f"no Kubernetes credentials for {watch}: {exc}"}},
        )
        return None


def _start_pod_watch(
    settings: ScorerSettings,
    metrics: ScorerMetrics,
    cache: NodeCache | None,
    log: logging.Logger,
    workloads: WorkloadLoads,
) -> PodCache | None:
    """The pod watch for in-flight accounting, started, or None when it is off or cannot run.

    It never stops the scorer from serving: without credentials (full-node mode needs none)
    or without RBAC for pods, verdicts read the nodes' annotations alone, and the metric
    `gpu_scorer_inflight_accounting` and a log line say so."""
    if not settings.pod_watch:
        log.info(
            "in-flight accounting off: verdicts read the nodes' annotations alone",
            extra={"fields": {"why": "--no-pod-watch"}},
        )
        return None
    from exporter_scheduler.edges.podcache import PodCache  # noqa: PLC0415

    pod_cache = PodCache(
        kubeconfig=settings.kubeconfig_file(),
        keys=Keys.for_prefix(settings.annotation_prefix),
        gpu_resource_name=settings.gpu_resource_name,
        label_selector=settings.pod_label_selector,
        metrics=metrics,
    )

    def start() -> PodCache:
        if cache is not None:
            pod_cache.add_sink(cache.store)
        pod_cache.add_sink(workloads)
        return pod_cache.start()

    return _started_or_none(
        start,
        log,
        "in-flight accounting off: verdicts read the nodes' annotations alone",
        "the pod watch",
    )


def _start_dra_watch(
    settings: ScorerSettings, metrics: ScorerMetrics, log: logging.Logger
) -> DraCache | None:
    """The DRA watch for DRA pods' verdicts, or None when it is off or has no credentials
    (DRA pods are then judged as other pods: one log line says so, the scorer serves on)."""
    if not settings.dra:
        return None
    from exporter_scheduler.edges.dracache import DraCache  # noqa: PLC0415

    return _started_or_none(
        lambda: DraCache(
            driver=settings.dra_driver,
            device_classes=[c.strip() for c in settings.dra_device_classes.split(",") if c],
            kubeconfig=settings.kubeconfig_file(),
            metrics=metrics,
        ).start(),
        log,
        "DRA pods judged as other pods: no DRA data",
        "the DRA watch",
    )


def _start_namespace_watch(
    settings: ScorerSettings, policies: PolicySet, metrics: ScorerMetrics, log: logging.Logger
) -> NamespaceCache | Literal[False] | None:
    """The Namespace watch when a profile chooses by namespace labels (None when none does;
    False when it cannot start: such profiles cannot work without credentials)."""
    if not policies.reads_labels:
        return None
    from exporter_scheduler.edges.namespacecache import NamespaceCache  # noqa: PLC0415

    try:
        return NamespaceCache(
            kubeconfig=settings.kubeconfig_file(),
            metrics=metrics,
        ).start()
    except Exception as exc:
        log.error(
            "a profile chooses by namespace-selector, which needs a Namespace watch, and "
            "there are no Kubernetes credentials for it: %s",
            exc,
        )
        return False


def _explain(args: argparse.Namespace) -> int:
    settings = _settings_from(args)
    policy = settings.policy()
    try:
        body = Path(args.request).read_bytes()
    except OSError as exc:
        raise SettingsError(f"--request {args.request}: cannot read it ({exc.strerror})") from None
    if args.now is None:
        now = datetime.now(UTC)
    else:
        parsed = parse_timestamp(args.now)
        if parsed is None:
            raise SettingsError(f"--now {args.now!r} is not an RFC 3339 time with a zone")
        now = parsed
    try:
        request = wire.decode_args(body, gpu_resource_name=policy.gpu_resource_name)
    except wire.WireError as exc:
        raise SettingsError(f"--request {args.request}: {exc}") from None
    if request.form != "nodes":
        raise SettingsError(
            f"--request {args.request}: explain needs full Node objects (a request sent with "
            "nodeCacheCapable: false); this one carries only node names"
        )
    # Offline there are no namespace labels: only profiles chosen by namespace name can match.
    policy = settings.policy_set().choose(request.pod.namespace, {})
    evaluation = evaluate(request.pod, request.nodes, now, policy)
    document = explain(evaluation, request.pod, now, policy)
    if args.output == "json":
        sys.stdout.write(msgspec.json.format(wire.encode_json(document), indent=2).decode())
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(document))
        if not render_text(document).endswith("\n"):
            sys.stdout.write("\n")
    return 0


def _label_gpu_pods(args: argparse.Namespace) -> int:
    from exporter_scheduler.edges.listwatch import make_api  # noqa: PLC0415
    from exporter_scheduler.edges.podlabels import LabelError, label_gpu_pods  # noqa: PLC0415

    settings = _settings_from(args)
    listener = configure_logging(settings.log_level)
    try:
        summary = label_gpu_pods(
            make_api(settings.kubeconfig_file()),
            keys=Keys.for_prefix(settings.annotation_prefix),
            resource=settings.gpu_resource_name,
            dry_run=args.dry_run,
        )
    except LabelError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    finally:
        listener.stop()
    print(summary.line())
    return 1 if summary.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "label-gpu-pods":
            return _label_gpu_pods(args)
        return _explain(args)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
