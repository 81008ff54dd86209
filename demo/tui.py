"""What the demo shows: a rich live view, plain log lines, and the closing summary.

Everything here renders an immutable `DemoSnapshot` that the demo takes from the running parts, so
the view never reaches into live threads and can be tested by rendering a hand-made snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpu_contract.schema import DEFAULT_PREFIX, Field
from kube_standins.scheduler_driver import Attempt, failed_scheduling_message

# Columns of the node table: (annotation field, header).
_NODE_COLUMNS: tuple[tuple[Field, str], ...] = (
    (Field.UTILIZATION, "util"),
    (Field.UTILIZATION_MAX, "max"),
    (Field.MEMORY_FRAGMENTATION, "frag"),
    (Field.MEMORY_FREE_MIB, "free MiB"),
    (Field.MEMORY_LARGEST_FREE_MIB, "largest"),
    (Field.TEMPERATURE, "°C"),
    (Field.HEALTH, "health"),
)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    model: str
    gpus_total: int
    gpus_used: int
    # The node's annotations under the prefix, full key -> value, as the API server holds them.
    annotations: Mapping[str, str]
    # Seconds since `updated-at` (the agent's sample time), None before the first write.
    data_age_s: float | None
    writes: int
    samples: int


@dataclass(frozen=True, slots=True)
class LatencyFigures:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True)
class DemoSnapshot:
    elapsed_s: float
    duration_s: float
    mode: str
    extender_url: str
    settings_line: str
    nodes: Sequence[NodeView]
    # Most recent attempts last.
    attempts: Sequence[Attempt]
    pods_submitted: int
    pods_placed: int
    pods_pending: int
    pods_running: int
    pods_finished: int
    latency: LatencyFigures | None
    prefix: str = DEFAULT_PREFIX
    # The node whose annotations are shown in full (describe-style); None: the first node.
    focus_node: str | None = None
    notes: Sequence[str] = field(default_factory=tuple)
    # Pods bound and still running (the others that were placed have ended).
    running_pods: frozenset[str] = frozenset()

    @property
    def writes(self) -> int:
        return sum(n.writes for n in self.nodes)

    @property
    def samples(self) -> int:
        return sum(n.samples for n in self.nodes)


def format_age(age_s: float | None) -> str:
    """`kubectl`-style age: `7s`, `2m5s`."""
    if age_s is None:
        return "-"
    seconds = max(0, int(age_s))
    if seconds < 60:
        return f"{seconds}s"
    return f"{seconds // 60}m{seconds % 60}s"


def others_summary(attempt: Attempt) -> str:
    """The reasons for the nodes the pod did not get, counted like a FailedScheduling event."""
    if not attempt.rejected:
        return ""
    histogram: dict[str, int] = {}
    for reason in attempt.rejected.values():
        histogram[reason] = histogram.get(reason, 0) + 1
    return ", ".join(sorted(f"{n} {reason}" for reason, n in histogram.items()))


def attempt_line(attempt: Attempt, *, total_nodes: int, models: Mapping[str, str]) -> str:
    """One plain line per scheduling attempt, for `--no-tui` and logs."""
    pod = attempt.pod
    hints = pod.hints_text()
    head = f"[{attempt.at_s:6.1f}s] pod {pod.name} ({pod.gpus} GPU{'s' if pod.gpus > 1 else ''}"
    head += f"; {hints})" if hints else ")"
    if attempt.node is not None:
        model = models.get(attempt.node, "?")
        line = f"{head} -> {attempt.node} ({model}): {attempt.why}"
        skipped = fallback_from(attempt, models)
        if skipped:
            line += f"; fell back from {skipped}"
        others = others_summary(attempt)
        return f"{line}; other nodes: {others}" if others else line
    if attempt.error:
        return f"{head} pending: {attempt.why}"
    return f"{head} pending: {failed_scheduling_message(total_nodes, attempt.rejected.values())}"


def write_line(elapsed_s: float, node: NodeView, prefix: str = DEFAULT_PREFIX) -> str:
    """One plain line when a node's annotations changed."""
    values = " ".join(
        f"{header}={node.annotations[prefix + f.value]}"
        for f, header in _NODE_COLUMNS
        if prefix + f.value in node.annotations
    )
    return (
        f"[{elapsed_s:6.1f}s] node {node.name} ({node.model}) annotations written: {values} "
        f"(writes {node.writes}, samples {node.samples})"
    )


def summary_lines(snapshot: DemoSnapshot) -> list[str]:
    """The closing summary, the same in both modes."""
    lines = [
        f"demo finished after {snapshot.elapsed_s:.1f}s ({snapshot.mode} mode, "
        f"{len(snapshot.nodes)} nodes)",
        f"pods: {snapshot.pods_submitted} submitted, {snapshot.pods_placed} placed, "
        f"{snapshot.pods_pending} pending, {snapshot.pods_running} running, "
        f"{snapshot.pods_finished} finished",
        f"agent writes: {snapshot.writes} made vs {snapshot.samples} samples taken "
        f"({_ratio(snapshot.writes, snapshot.samples)})",
    ]
    models = {n.name: n.model for n in snapshot.nodes}
    fallbacks = sum(1 for a in snapshot.attempts if fallback_from(a, models, snapshot.prefix))
    lines.append(f"model-preference fallbacks: {fallbacks}")
    if snapshot.latency is None and "real kube-scheduler" in snapshot.mode:
        # kube-scheduler makes the calls; the scorer's own request times are on its /metrics.
        lines.append(f"extender calls: made by kube-scheduler ({snapshot.extender_url}/metrics)")
    elif snapshot.latency is None:
        lines.append("extender latency: no calls made")
    else:
        lat = snapshot.latency
        lines.append(
            f"extender latency: p50 {lat.p50_ms:.2f} ms, p99 {lat.p99_ms:.2f} ms, "
            f"max {lat.max_ms:.2f} ms over {lat.count} calls (HTTP round trip)"
        )
    return lines


def _ratio(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}% of samples" if whole else "no samples"


def fallback_from(
    attempt: Attempt, models: Mapping[str, str], prefix: str = DEFAULT_PREFIX
) -> str | None:
    """The preferred model a placed pod did not get (`A100` when it landed on a V100), or None."""
    chain = attempt.pod.hint("gpu-model-preference", prefix)
    if not chain or attempt.node is None:
        return None
    first = chain.split(",")[0].strip()
    model = models.get(attempt.node, "")
    if not first or first == "*" or first.upper() in model.upper():
        return None
    return first


# ----------------------------------------------------------------------------------------------
# The live view


def render(snapshot: DemoSnapshot, *, height: int = 60) -> RenderableType:
    """The whole screen for one snapshot, fitting the pod table into `height` lines."""
    # Header 4-5 lines, node table 5 + one per node, describe panel 3 + one per annotation,
    # pod table 4 + about 2 per pod (two-line cells), footer 2.
    focus_lines = max((len(n.annotations) for n in snapshot.nodes), default=1)
    fixed = 5 + 6 + len(snapshot.nodes) + 4 + 2
    describe_lines = 3 + focus_lines
    # The describe panel repeats the focus node's row in kubectl's words; on a short terminal
    # the pods matter more.
    with_describe = (height - fixed - describe_lines) // 2 >= 5
    pod_rows = max(2, (height - fixed - (describe_lines if with_describe else 0)) // 2)
    parts = [_header(snapshot), _node_table(snapshot)]
    if with_describe:
        parts.append(_describe_panel(snapshot))
    parts += [_pod_table(snapshot, pod_rows), _footer(snapshot)]
    return Group(*parts)


def _header(snapshot: DemoSnapshot) -> RenderableType:
    title = Text("gpu-live-scheduler demo", style="bold")
    title.append(
        f"  {snapshot.elapsed_s:4.0f}s / {snapshot.duration_s:.0f}s   "
        f"extender {snapshot.extender_url} ({snapshot.mode})",
        style="dim",
    )
    body = Text(snapshot.settings_line, style="yellow")
    for note in snapshot.notes:
        body.append("\n" + note, style="dim")
    return Panel(Group(title, body), padding=(0, 1))


def _node_table(snapshot: DemoSnapshot) -> RenderableType:
    table = Table(
        title="Nodes (annotations as the API server holds them)",
        caption="GPUs: allocated/allocatable; age: of updated-at; writes: patches that reached "
        "the API server / samples taken",
        expand=True,
    )
    table.add_column("node", no_wrap=True)
    table.add_column("model")
    table.add_column("GPUs", justify="right")
    for _, header in _NODE_COLUMNS:
        table.add_column(header, justify="right")
    table.add_column("age", justify="right")
    table.add_column("writes", justify="right", no_wrap=True)
    for node in snapshot.nodes:
        cells = [node.annotations.get(snapshot.prefix + f.value, "-") for f, _ in _NODE_COLUMNS]
        util = node.annotations.get(snapshot.prefix + Field.UTILIZATION.value)
        style = _util_style(util)
        table.add_row(
            node.name,
            node.model,
            f"{node.gpus_used}/{node.gpus_total}",
            *[Text(c, style=style) if i == 0 else c for i, c in enumerate(cells)],
            format_age(node.data_age_s),
            f"{node.writes}/{node.samples}",
        )
    return table


def _util_style(value: str | None) -> str:
    try:
        util = float(value) if value is not None else None
    except ValueError:
        return ""
    if util is None:
        return "dim"
    if util > 0.9:
        return "bold red"
    if util > 0.8:
        return "yellow"
    return "green"


def _describe_panel(snapshot: DemoSnapshot) -> RenderableType:
    """`kubectl describe node` shows annotations as `key: value` lines; so does this panel."""
    if not snapshot.nodes:
        return Text("")
    focus = next((n for n in snapshot.nodes if n.name == snapshot.focus_node), snapshot.nodes[0])
    lines = Text()
    for i, key in enumerate(sorted(focus.annotations)):
        label = "Annotations:        " if i == 0 else "                    "
        lines.append(label, style="bold" if i == 0 else "")
        lines.append(f"{key}: {focus.annotations[key]}\n")
    if not focus.annotations:
        lines.append("Annotations:        <none>\n")
    lines.append(f"(updated-at is {format_age(focus.data_age_s)} old)", style="dim")
    return Panel(lines, title=f"kubectl describe node {focus.name}", title_align="left")


def latest_per_pod(attempts: Sequence[Attempt]) -> list[Attempt]:
    """Each pod's latest attempt, in the order those attempts happened (a pending pod that is
    retried moves down instead of filling the table with repeats)."""
    latest: dict[str, Attempt] = {}
    for attempt in attempts:
        latest.pop(attempt.pod.name, None)
        latest[attempt.pod.name] = attempt
    return list(latest.values())


def _pod_table(snapshot: DemoSnapshot, rows: int) -> RenderableType:
    table = Table(title="Pods (each pod's latest scheduling attempt)", expand=True)
    table.add_column("pod", no_wrap=True, min_width=16)
    table.add_column("node", no_wrap=True, min_width=10)
    table.add_column("why", ratio=2, min_width=18)
    table.add_column("the other nodes", ratio=3, min_width=24)
    total = len(snapshot.nodes)
    models = {n.name: n.model for n in snapshot.nodes}
    for attempt in latest_per_pod(snapshot.attempts)[-rows:] if rows > 0 else []:
        pod = attempt.pod
        cell = Text(pod.name)
        cell.append(f"  {attempt.at_s:.0f}s", style="dim")
        cell.append(f"\n{pod.gpus} GPU{'s' if pod.gpus > 1 else ''}", style="dim")
        hints = pod.hints_text(snapshot.prefix)
        if hints:
            cell.append(f"  {hints}", style="cyan")
        if attempt.node is not None:
            running = pod.name in snapshot.running_pods
            node = Text(attempt.node, style="green" if running else "dim")
            if not running:
                node.append("\n(ended)")
            why = Text(attempt.why)
            skipped = fallback_from(attempt, models, snapshot.prefix)
            if skipped:
                why.append(f"; fell back from {skipped}", style="magenta")
            others = others_summary(attempt)
        else:
            node = Text("pending", style="yellow")
            why = Text(attempt.why if attempt.error else "no node passed", style="yellow")
            others = (
                failed_scheduling_message(total, attempt.rejected.values())
                if attempt.rejected
                else ""
            )
        table.add_row(cell, node, why, others)
    return table


def _footer(snapshot: DemoSnapshot) -> RenderableType:
    return Text(" | ".join(summary_lines(snapshot)[1:]), style="bold")
