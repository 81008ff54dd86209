"""Regenerate every figure and table of docs/performance.md in one run.

    python3 dev.py figures                      # = python -m benchmarks.figures
    python -m benchmarks.figures --quick --out-dir /tmp/perf --no-benchmarks   # smoke run
    python -m benchmarks.figures --sections storm,agent   # redo some; keep the others' text

The sections are the modules of `benchmarks.sections`, listed in `SECTIONS` in the document's
order; each runs its own simulations or benchmarks (the benchmarks as processes of their own, so
their timings are not disturbed by this one's memory), draws its PNGs under `<out-dir>/img/` and
returns its markdown. This module runs the sections asked for and assembles
`<out-dir>/performance.md`: a header, the sections, the models' limits and the timing table.

A section a run does not redo keeps its text, figures and timing rows from the earlier document,
found by its heading; text written by hand under a section, below a heading of its own (a study
of its figures), stays with that section across runs. A benchmark that fails or is missing is
reported in the document, and the rest is still produced.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks.machine import machine_description
from benchmarks.sections import (
    agent,
    fleet,
    inflight,
    ownload,
    placement,
    profile,
    scheduler,
    scorer,
    seeds,
    storm,
)
from benchmarks.sections import markdown as md
from benchmarks.sections.section import COMMAND, FULL, QUICK, ROOT, RunContext, Section, Timed

# The document's sections, in its order (and the order a full run redoes them in).
SECTIONS: Final[tuple[Section, ...]] = (
    fleet.SECTION,
    storm.SECTION,
    placement.SECTION,
    seeds.SECTION,
    agent.SECTION,
    scorer.SECTION,
    scheduler.SECTION,
    profile.SECTION,
    inflight.SECTION,
    ownload.SECTION,
)
NAMES: Final = tuple(section.name for section in SECTIONS)
# The seeds the committed figures use ("fixed seeds everywhere", as the document says).
FLEET_SEED: Final = 7
PLACEMENT_SEED: Final = 11
# The document's own tail, written anew by every run.
LIMITS_HEADING: Final = "## What these models leave out"
TIMING_HEADING: Final = "## Regeneration time"


def render_document(
    *,
    machine: str,
    started: datetime,
    timings: Sequence[Timed],
    sections: Sequence[str],
    quick: bool,
    redone: Sequence[str] | None = None,
    regenerated_at: datetime | None = None,
    regenerated_on: str | None = None,
) -> str:
    """The whole document around the sections' texts. `started` and `machine` date the full
    run the numbers come from; a partial run names what it `redone` at `regenerated_at` on
    `regenerated_on`."""
    total = sum(t.seconds for t in timings)
    timing_table = md.table(
        ["step", "wall time (s)"], [[t.label, f"{t.seconds:.1f}"] for t in timings]
    )
    quick_note = (
        "\n> **Quick smoke run**: small sizes, numbers not representative.\n" if quick else ""
    )
    small_machine = (
        ": a small shared VM (the committed numbers come from a 2-core one), so absolute times "
        "are pessimistic and noisy"
        if (os.cpu_count() or 1) <= 4
        else ""
    )
    partial_note = (
        f"\n> **Partly regenerated** on {regenerated_at or started:%Y-%m-%d %H:%M} UTC on "
        f"{regenerated_on or machine}: the "
        f"{', '.join(redone)} section(s) (`python -m benchmarks.figures --sections "
        f"{','.join(redone)}`); the others and their timings are from the run dated below.\n"
        if redone
        else ""
    )
    return f"""# Performance
{quick_note}{partial_note}
Every number and figure here was produced by one command, from a fresh clone:

    {COMMAND}

(`python -m benchmarks.figures`; it rewrites this file and `docs/img/*.png`; edit
`benchmarks/figures.py`, not this file). These numbers: {started:%Y-%m-%d %H:%M} UTC on
{machine}{small_machine}. Ratios measured in the same run are what to compare. The whole
regeneration took {total:.0f} s.

Method: fixed seeds everywhere (fleet 7, placement 11); the project and its baselines run side
by side in the same process on the same inputs; latencies are medians and p99 of many
repetitions; every table names the command that reproduces it alone. The raw summaries behind
the tables are in `img/figures.json`.

{chr(10).join(sections)}
{LIMITS_HEADING}

- The API server answers instantly and never fails outside the storm window; real patches take
  milliseconds, which does not change when the agent writes.
- The bytes columns count request bodies only. Every successful patch is also a watch event that
  carries the whole Node object (several KB) to every Node watcher (schedulers, CNI agents,
  controllers), so the fan-out cost scales with the write rate the same way.
- The GPU traces are synthetic and seeded. Real utilization can be noisier or smoother; the
  busiest-GPU field (`utilization-max`) is the most sensitive to that, because the maximum of
  several noisy GPUs moves more than their mean.
- The placement model leaves out the default plugins' own scores, preemption, pod affinity and
  restarts of crashed pods; pending pods are retried on kube-scheduler's back-off rather than on
  cluster events; the device plugin is assumed to hand out the least-shared free slots, lowest
  GPU index first (the real one picks by NVLink topology or in no defined order, blind to load
  either way). The lag from bind to load is drawn per pod from fixed distributions: a node's
  image cache is not modelled (a fixed share of pods finds its image cached), nor registry or
  kubelet contention within a burst. Once its ramp is over, a training pod's or a notebook's
  load is constant over its run, and an inference replica's follows its Deployment's traffic
  (a slow swing over two hours, shared by all its replicas at once), never a burst within
  seconds. Its fleet is small (tens of nodes) to keep the regeneration within minutes.

{TIMING_HEADING}

{timing_table}
"""


def _kept_sections(document: str) -> dict[str, str]:
    """The text of each section of an earlier document, by section name."""
    kept: dict[str, str] = {}
    names = {section.heading: section.name for section in SECTIONS}
    current: str | None = None
    for line in document.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line.rstrip("\n")
            if heading in names:
                current = names[heading]
            elif heading.startswith(LIMITS_HEADING) or heading == TIMING_HEADING:
                current = None  # the document's own tail, written anew by every run
            # Any other heading is text written under a section (a study of its figures):
            # it stays with the section it follows.
        if current is not None:
            kept[current] = kept.get(current, "") + line
    # A section ends with one newline, as rendered; the blank line before the next heading is
    # the document's.
    return {name: text.rstrip() + "\n" for name, text in kept.items()}


def _studies(section: str) -> str:
    """The text under headings of its own at the end of a kept section (written there by hand,
    a study of the section's figures), which a run that redoes the section keeps after it."""
    offset = 0
    for line in section.splitlines(keepends=True):
        if offset and line.startswith("## "):
            return section[offset:]
        offset += len(line)
    return ""


def _kept_timings(document: str, redone: Sequence[str]) -> list[Timed]:
    """Rows of an earlier document's timing table for the steps of sections not redone."""
    # The longest prefix wins: the storm's step begins like the fleet's.
    owner_of = sorted(
        ((prefix, section.name) for section in SECTIONS for prefix in section.steps),
        key=lambda pair: -len(pair[0]),
    )
    rows: list[Timed] = []
    table = document.split(TIMING_HEADING, 1)[-1]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("step", "---"):
            continue
        owner = next((name for prefix, name in owner_of if cells[0].startswith(prefix)), None)
        if owner is not None and owner not in redone:
            try:
                rows.append(Timed(cells[0], float(cells[1])))
            except ValueError:
                continue
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.figures", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=ROOT / "docs",
        help="where performance.md and img/ go (default: docs/)",
    )
    parser.add_argument(
        "--no-benchmarks",
        action="store_true",
        help="skip the benchmarks that run as processes of their own (every section but the "
        "simulations: fleet, storm, placement, seeds); their sections say so",
    )
    parser.add_argument(
        "--sections",
        default=",".join(NAMES),
        help=(
            "comma-separated sections to regenerate (" + ", ".join(NAMES) + "); the others "
            "keep their text, figures and timings from the existing document"
        ),
    )
    parser.add_argument("--fleet-seed", type=int, default=FLEET_SEED)
    parser.add_argument("--placement-seed", type=int, default=PLACEMENT_SEED)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        parser.error(f"unknown sections {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    out: Path = args.out_dir
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    previous_path = out / "performance.md"
    previous = previous_path.read_text() if previous_path.exists() else ""
    kept = _kept_sections(previous)
    missing = [name for name in NAMES if name not in chosen and name not in kept]
    if missing and not kept:
        parser.error(f"no earlier text to keep for {', '.join(missing)}: regenerate them too")
    if missing:
        # A document written before a section existed: it keeps lacking that section until a
        # run regenerates it, rather than gaining a placeholder.
        print(
            f"the earlier document has no {', '.join(missing)} section; left out "
            f"(--sections {','.join(missing)} adds it)",
            file=sys.stderr,
        )
    started = datetime.now(UTC)
    texts: dict[str, str] = {
        name: kept[name] for name in NAMES if name not in chosen and name in kept
    }
    summary_path = img / "figures.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    ctx = RunContext(
        sizes=QUICK if args.quick else FULL,
        quick=args.quick,
        no_benchmarks=args.no_benchmarks,
        fleet_seed=args.fleet_seed,
        placement_seed=args.placement_seed,
        img=img,
        timings=[],
        summary=summary,
    )
    for section in SECTIONS:
        if section.name in chosen:
            texts[section.name] = section.run(ctx)

    for name in chosen:
        studies = _studies(kept.get(name, ""))
        if studies and name in texts:
            texts[name] = texts[name].rstrip() + "\n\n" + studies
    dated = started
    machine = here = machine_description()
    timings = ctx.timings
    if len(chosen) < len(NAMES):
        timings = [*_kept_timings(previous, chosen), *timings]
        # The kept sections were measured at the earlier run's time, on its machine.
        found = re.search(
            r"These numbers: (\d{4}-\d\d-\d\d \d\d:\d\d) UTC on\n(.+?)(?=: a small| ?\. Ratios)",
            previous,
        )
        if found:
            dated = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
            machine = found.group(2)
    document = render_document(
        machine=machine,
        regenerated_on=here,
        started=dated,
        regenerated_at=started,
        timings=timings,
        sections=[texts[name] for name in NAMES if name in texts],
        quick=args.quick,
        redone=chosen if len(chosen) < len(NAMES) else None,
    )
    previous_path.write_text(document)
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {previous_path} and {img}/*.png", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
