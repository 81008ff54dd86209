"""The scorer-latency section: the scorer's server time per request, this checkout beside an
earlier version, from `benchmarks.scorer_latency`, run as a process of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from benchmarks.sections import markdown as md
from benchmarks.sections.markdown import num, pick
from benchmarks.sections.plots import plt, save
from benchmarks.sections.section import RunContext, Section, not_measured, run_benchmark, skipped

HEADING: Final = "## Scorer latency"
# Its one step in the timing table.
STEP: Final = "benchmark: scorer latency"
MODULE: Final = "benchmarks.scorer_latency"
# The scorer as it was before verdicts were kept by the node cache (reply cache, verdict memo,
# uvicorn): the benchmark measures it beside this checkout, from an export of the commit.
BEFORE_REF: Final = "e12c8b2"


def _latency_rows(data: Any) -> list[dict[str, Any]]:
    """The scorer benchmark's rows (one per mode and node count)."""
    rows = data.get("rows") if isinstance(data, dict) else None
    return [r for r in rows or [] if isinstance(r, dict)]


def fig_scorer_latency(rows: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Filter and prioritize server time, before and after, per mode and node count."""
    groups = [r for r in rows if pick(r, "after_filter.median_ms") is not None]
    if not groups:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for ax, verb in zip(axes, ("filter", "prioritize"), strict=True):
        labels = [f"{r['mode']}\n{r['nodes']:,}" for r in groups]
        x = np.arange(len(groups))
        width = 0.38
        for offset, label, color in ((-width / 2, "before", "#bbbbbb"), (width / 2, "after", "C0")):
            values = [pick(r, f"{label}_{verb}.median_ms") for r in groups]
            if any(v is not None for v in values):
                ax.bar(
                    x + offset,
                    [v if v is not None else 0.0 for v in values],
                    width,
                    label=f"{label} ({'earlier version' if label == 'before' else 'this one'})",
                    color=color,
                )
        if verb == "filter":
            # Full-node rows only: a names-only body decodes within the noise of zero, which a
            # log scale cannot draw.
            for i, r in enumerate(groups):
                floor = pick(r, "floor.median_ms") if r.get("mode") == "full" else None
                if floor is not None and floor > 0:
                    ax.hlines(floor, i - width, i + width, colors="k", linestyles="--")
            ax.plot([], [], "k--", label="floor (typed decode)")
        ax.set_xticks(x, labels)
        ax.set_yscale("log")
        ax.set_ylabel("Server time over HTTP, median (ms)")
        ax.set_title(f"{verb}: names only during churn (~100 Node events/s); full Nodes")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)
    return True


def render(bench: Mapping[str, Any], plotted: bool) -> str:
    """The section from the benchmark's outcome (`run_benchmark`'s), measured or not;
    `plotted` says whether its figure was drawn."""
    if "error" in bench:
        return not_measured(HEADING, bench)
    data = bench["data"]
    rows = _latency_rows(data)
    trees = data.get("trees", ["after"]) if isinstance(data, dict) else ["after"]
    before = "before" in trees

    def ms(row: Mapping[str, Any], key: str) -> str:
        value = pick(row, key + ".median_ms")
        return "n/a" if value is None else num(value, 2 if value < 10 else 1)

    def ratio(row: Mapping[str, Any], verb: str) -> str:
        old, new = pick(row, f"before_{verb}.median_ms"), pick(row, f"after_{verb}.median_ms")
        return "n/a" if not old or not new else num(old / new, 1) + " x"

    table_rows = []
    for r in rows:
        for verb in ("filter", "prioritize", "again"):
            if f"after_{verb}" not in r:
                continue
            name = "filter, again" if verb == "again" else verb
            cells = [str(r["mode"]), f"{r['nodes']:,}", name]
            if before:
                cells += [ms(r, f"before_{verb}")]
            cells += [ms(r, f"after_{verb}"), ms(r, f"after_{verb}_handler")]
            if before:
                cells += [ratio(r, verb)]
            table_rows.append(cells)
    header = ["mode", "nodes", "request"]
    header += ["before"] if before else []
    header += ["after", "after, handler only"]
    header += ["before / after"] if before else []
    body = md.table(header, table_rows)

    full = [r for r in rows if r.get("mode") == "full" and "floor" in r]
    if full:
        floor_rows = []
        for r in full:
            cells = [f"{r['nodes']:,}", num(r["body_bytes"] / 1e6, 1), ms(r, "floor")]
            if before:
                cells.append(num(float(r["before_filter_over_floor"]), 2) + " x")
            cells.append(num(float(r["after_filter_over_floor"]), 2) + " x")
            cells.append(
                num(float(r["after_prioritize"]["median_ms"]) / r["floor"]["median_ms"], 2) + " x"
            )
            floor_rows.append(cells)
        floor_header = ["full nodes", "body (MB)", "floor"]
        floor_header += ["filter / floor, before"] if before else []
        floor_header += ["filter / floor", "prioritize / floor"]
        body += (
            "\n\nFull-node requests against the floor (msgspec's typed decode of the same body to "
            "each Node's name, annotations and managedFields, served by the do-nothing server; "
            "its server time measured the same way):\n\n" + md.table(floor_header, floor_rows)
        )

    names = [r for r in rows if "after_event_us" in r]
    if names:
        event_rows = []
        for r in names:
            cells = [f"{r['nodes']:,}"]
            if before:
                cells.append(num(float(r["before_event_us"]), 0))
            cells.append(num(float(r["after_event_us"]), 0))
            cells.append(num(float(r["classes_event_us"]["after"]), 0))
            share = float(r["classes_event_us"]["after"]) * 110 / 1e6 * 100
            cells.append(num(share, 2) + " %")
            floor = pick(r, "floor.median_ms")
            cells.append("n/a" if floor is None else num(float(floor) * 1e3, 0))
            event_rows.append(cells)
        event_header = ["cached nodes"]
        event_header += ["before, µs"] if before else []
        event_header += [
            "after, 1 class, µs",
            "after, 4 classes, µs",
            "one core at 110 events/s, 4 classes",
            "filter floor, µs",
        ]
        body += (
            "\n\nThe node cache's cost per watch event (a MODIFIED event of a ~7 KB Node: decode, "
            "and in this version the verdict for every active pod class), medians over the churn "
            "events of the run; and the names-only filter's floor (the typed decode of its names "
            "and of what the scorer reads of its Pod, served by the do-nothing server; its server "
            "time measured as the scorer's, so within the noise of zero):\n\n"
            + md.table(event_header, event_rows)
        )

    checks = data.get("targets", []) if isinstance(data, dict) else []
    if checks:
        body += "\n\n" + "\n".join(
            f"- {'met' if c.get('met') else '**missed**'}: {c.get('target')} "
            f"(measured {c.get('value')})"
            for c in checks
            if isinstance(c, Mapping)
        )
    figure = "![scorer server time, before and after](img/scorer_latency.png)\n" if plotted else ""
    machine = data.get("machine") if isinstance(data, dict) else None
    ref = data.get("before") if isinstance(data, dict) else None
    versions = (
        f"`before` is the scorer of commit `{ref}` (reply cache, verdict memo, uvicorn), run from "
        "an export of that commit in the same invocation; `after` is this checkout."
        if before
        else "Only this checkout was measured (the earlier version was not available)."
    )
    return f"""{HEADING}

Command: `{bench["command"]}`{f" (machine: {machine})" if machine else ""}. Every server runs in
its own process on loopback and one client calls them in turn, sample after sample. Each sample is
one pod as kube-scheduler sends it (`benchmarks/kube_requests.py`, checked against a real v1.36
scheduler by `benchmarks.window_check`): a fresh Pod from a mix of classes, the next window of the
scheduler's rotation over the nodes (230 names at 500 nodes, 500 at 5,000), its filter, then its
prioritize of the names the filter passed; no list and no pod comes twice. **Server
time** is a scorer's HTTP round trip minus the round trip of a do-nothing server (it reads the
request and answers the scorer's own reply bytes) for the same request in the same sample, the
median of those differences: everything the scorer adds to moving the bytes, HTTP parsing
included; `handler only` is measured inside the scorer (decode, verdicts, reply). {versions}
Names-only rows run during live churn: the API stand-in rewrites about 100 Nodes a second,
delivered through each scorer's own list+watch loop while the requests are sent; `filter,
quiet` is the filter alone (no prioritize follows it) with the churn paused, after as many
untimed pods (a pod class's first filter judges every node for it). Times in ms, medians.

{body}

{figure}"""


def run(ctx: RunContext) -> str:
    """Run the benchmark against `BEFORE_REF` (shorter when quick), draw, write the section."""
    if ctx.no_benchmarks:
        bench = skipped(MODULE)
    else:
        extra = ["--before", BEFORE_REF]
        extra += ["--quick"] if ctx.quick else []
        bench = ctx.timed(STEP, lambda: run_benchmark(MODULE, extra, 900))
    figure = ctx.img / "scorer_latency.png"
    plotted = "data" in bench and fig_scorer_latency(_latency_rows(bench["data"]), figure)
    if not plotted and figure.exists():
        # A figure from an earlier run must not sit next to a document that says "not measured".
        figure.unlink()
    return render(bench, plotted)


SECTION: Final = Section(name="scorer", heading=HEADING, steps=(STEP,), run=run)
