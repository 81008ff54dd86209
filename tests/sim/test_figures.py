"""The figures command: a quick end-to-end run into a temporary folder, its failure paths, and
that every section is listed, found by its heading and rendered from its data as committed."""

from __future__ import annotations

import importlib
import json
import pkgutil
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import benchmarks.sections
from benchmarks import figures, pod_watch, real_scheduler, scheduler_profile
from benchmarks.sections import (
    agent,
    inflight,
    placement,
    profile,
    scheduler,
    scorer,
    seeds,
    storm,
)
from benchmarks.sections.section import FULL, command_line, run_benchmark
from fleet_sim.placement import PlacementConfig

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "docs" / "performance.md"
SUMMARY = ROOT / "docs" / "img" / "figures.json"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("perf")
    assert figures.main(["--quick", "--out-dir", str(out), "--no-benchmarks"]) == 0
    return out


@pytest.mark.parametrize(
    "name",
    ["writes_vs_fleet.png", "data_age.png", "storm.png", "placement.png", "fragmentation.png"],
)
def test_quick_run_draws_every_figure(quick_run: Path, name: str) -> None:
    image = quick_run / "img" / name
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_run_writes_the_document(quick_run: Path) -> None:
    text = (quick_run / "performance.md").read_text()
    # Each section once, under its heading, in the listed order: a partial run finds them so.
    assert list(figures._kept_sections(text)) == list(figures.NAMES)
    lines = text.splitlines()
    for section in figures.SECTIONS:
        assert lines.count(section.heading) == 1, section.name
    assert "python3 dev.py figures" in text
    assert "Quick smoke run" in text
    # Skipped benchmarks are said to be skipped, not silently left out.
    assert text.count("skipped (--no-benchmarks)") == 5
    for image in ("writes_vs_fleet", "data_age", "storm", "placement", "fragmentation"):
        assert f"(img/{image}.png)" in text


def test_missing_benchmark_is_reported_not_raised() -> None:
    outcome = run_benchmark("benchmarks.no_such_benchmark", [], timeout_s=60)
    assert "error" in outcome
    assert "no_such_benchmark" in outcome["command"]
    section = agent.render(outcome)
    assert "Not measured in this run" in section


def test_agent_section_renders_the_benchmark_json() -> None:
    data = {
        "machine": "test box",
        "targets": {"tick_ms_8_gpus": 5.0, "peak_rss_mb": 80.0},
        "ticks": [
            {
                "gpus": 8,
                "ticks": 100,
                "writes": 9,
                "cpu": {"median_ms": 0.05, "p99_ms": 0.07},
                "wall": {"median_ms": 0.05, "p99_ms": 0.08},
                "agent_tick_cpu": {"median_ms": 0.09, "p99_ms": 0.2},
                "source_read_wall": {"median_ms": 0.2, "p99_ms": 0.3},
            }
        ],
        "rss": {"seconds": 6.0, "peak_rss_mb": 81.5},
        "rss_optimized": {"seconds": 6.0, "peak_rss_mb": 61.5},
        "rss_no_pod_resources": {"seconds": 6.0, "peak_rss_mb": 70.0},
    }
    section = agent.render({"data": data, "command": "python -m x --json"})
    assert "| 8 | 0.050 | 0.070 | 0.050 | 0.080 | 0.090 | 0.200 | 0.200 | 9/100 |" in section
    assert "(grpc loaded): peak RSS **81.5 MB** after 6.0 s (**missed**" in section
    assert (
        "`python -OO`, allocations from a kubelet stand-in (grpc loaded): peak RSS **61.5 MB**"
        in section
    )
    assert "`--pod-resources=false` (no grpc): peak RSS **70.0 MB** after 6.0 s (met" in section
    assert "python -OO`, `--pod-resources=false`" not in section  # not measured: not shown


def _timing(ms: float) -> dict[str, float]:
    return {"median_ms": ms, "p99_ms": 2 * ms, "n": 10}


def test_scorer_latency_figure_and_section_from_rows(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = []
    for mode in ("names", "full"):
        for nodes in (500, 5000):
            row: dict[str, object] = {"mode": mode, "nodes": nodes, "body_bytes": nodes * 7500}
            for label, factor in (("after", 1.0), ("before", 3.0)):
                verbs = ("filter", "prioritize", "again") if mode == "names" else ("filter",)
                for verb in (*verbs, "prioritize"):
                    row[f"{label}_{verb}"] = _timing(factor * nodes / 1000)
                    row[f"{label}_{verb}_handler"] = _timing(factor * nodes / 1100)
            if mode == "full":
                row["floor"] = _timing(nodes / 2000)
                row["after_filter_over_floor"] = 2.0
                row["before_filter_over_floor"] = 6.0
            else:
                # A names-only floor: within the noise of zero, here below it.
                row["floor"] = _timing(-0.004 if nodes == 500 else 0.012)
                row["after_event_us"] = 25.0
                row["before_event_us"] = 20.0
                row["classes_event_us"] = {"after": 40.0, "before": 20.0}
                row["churn_nodes"] = 100
            rows.append(row)
    path = tmp_path / "latency.png"
    assert scorer.fig_scorer_latency(rows, path)
    assert path.stat().st_size > 0
    assert not scorer.fig_scorer_latency([{"mode": "full"}], tmp_path / "none.png")
    targets = [{"target": "names-only filter server time <= 0.3 ms", "value": 0.5, "met": False}]
    data = {"rows": rows, "targets": targets, "trees": ["after", "before"], "before": "abc123"}
    section = scorer.render({"data": data, "command": "c"}, plotted=True)
    assert "scorer_latency.png" in section
    assert "**missed**: names-only filter server time <= 0.3 ms" in section
    assert "| names | 500 | filter | 1.50 | 0.50 | 0.45 | 3.0 x |" in section
    assert "`abc123`" in section
    assert "0.44 %" in section  # 40 us x 110 events/s of one core
    # Names-only rows show their floor beside the events, not in the full-node floor table.
    assert "| 5,000 | 20 | 25 | 40 | 0.44 % | 12 |" in section
    assert "| 500 | 20 | 25 | 40 | 0.44 % | -4 |" in section  # below zero: noise, shown as it is
    full_table = section.split("Full-node requests against the floor", 1)[1].split("\n\n")[1]
    assert full_table.count("\n") == 3  # header, rule, 500 and 5,000 full nodes


def test_a_partial_run_redoes_its_sections_and_keeps_the_others(
    quick_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "perf"
    shutil.copytree(quick_run, out)
    before = (out / "performance.md").read_text()
    kept = figures._kept_sections(before)
    assert figures.main(["--quick", "--out-dir", str(out), "--sections", "storm"]) == 0
    after = (out / "performance.md").read_text()
    again = figures._kept_sections(after)
    for name in ("fleet", "placement", "seeds", "agent", "scorer", "scheduler"):
        assert again[name] == kept[name], name
    assert "Partly regenerated" in after
    assert "--sections storm" in after
    # The kept sections keep the date and machine they were measured on.
    dated = before.split("These numbers: ", 1)[1].split(" UTC on", 1)[0]
    assert f"These numbers: {dated} UTC on" in after
    # The kept sections' steps stay in the timing table beside the storm's new one.
    assert placement.STEP in after.split(figures.TIMING_HEADING, 1)[1]


def _variant(pushed: int, pending: int, **causes: int) -> dict[str, object]:
    by_cause = {"in-flight": 0, "busy-at-bind": 0, "after-bind": 0, "within-limit": 0}
    by_cause.update({name.replace("_", "-"): n for name, n in causes.items()})
    assert sum(by_cause.values()) == pushed
    return {
        "gpus_pushed_over_limit": pushed,
        "pending_at_end": pending,
        "gpus_pushed_over_limit_by_cause": by_cause,
    }


def test_the_seeds_section_sums_each_variant_and_judges_the_target() -> None:
    plain = {
        "per-gpu-without-either": _variant(20, 5, in_flight=4, busy_at_bind=6, within_limit=10),
        "per-gpu-without-inflight": _variant(15, 6, in_flight=4, within_limit=11),
        "per-gpu-without-blind-plugin": _variant(14, 5, busy_at_bind=4, within_limit=10),
        "per-gpu": _variant(3, 4, within_limit=2, after_bind=1),
    }
    declared = {
        "per-gpu": _variant(1, 9, after_bind=1),
        "per-gpu-without-either": _variant(8, 7, within_limit=8),
    }
    data = {
        "nodes": 12,
        "duration_s": 1200.0,
        "seeds": {
            "11": {"plain": plain, "declared": declared},
            "12": {
                "plain": {**plain, "per-gpu": _variant(2, 6, within_limit=2)},
                "declared": declared,
            },
        },
    }
    section = seeds.render(data)
    assert section.startswith(seeds.HEADING + "\n")
    assert "--seeds 11,12" in section
    # Columns: both, in-flight only, blind-plugin only, neither.
    assert "| 11 | 3 / 4 | 14 / 5 | 15 / 6 | 20 / 5 |" in section
    assert "| sum | 5 / 10 | 28 / 10 | 30 / 12 | 40 / 10 |" in section
    assert "| 0 / 0 | 0 / 8 | 8 / 0 | 8 / 12 |" in section  # in flight / busy at the bind
    # 5 of 40 pushed is within 20 %, and 10 pending is not more than 10: both met.
    flat = " ".join(section.split())
    assert "pushed 5 against 40 (12%: met); pending 10 against 10 (met)" in flat
    assert "`per-gpu` 2 / 18, `per-gpu-without-either` 16 / 14" in flat
    assert "8 more pods are pending at the end (80% more)" in flat


def test_a_study_written_under_a_section_survives_partial_runs(
    quick_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "perf"
    shutil.copytree(quick_run, out)
    document = (out / "performance.md").read_text()
    study = "## Where the storm's time goes\n\nA study written by hand.\n"
    at = document.index(placement.HEADING + "\n")
    (out / "performance.md").write_text(document[:at] + study + "\n" + document[at:])
    # Another section redone: the study stays with the storm section, whole.
    assert figures.main(["--quick", "--out-dir", str(out), "--sections", "agent"]) == 0
    after = (out / "performance.md").read_text()
    assert figures._kept_sections(after)["storm"].endswith(study)
    # The storm section itself redone: its new text, then the study again.
    assert figures.main(["--quick", "--out-dir", str(out), "--sections", "storm"]) == 0
    again = (out / "performance.md").read_text()
    assert again.count(study) == 1
    assert again.index(storm.HEADING) < again.index(study) < again.index(placement.HEADING)


def test_a_partial_run_leaves_out_a_section_the_earlier_document_never_had(
    quick_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "perf"
    shutil.copytree(quick_run, out)
    document = (out / "performance.md").read_text()
    heading = scheduler.HEADING
    start = document.index(heading)
    end = document.index(figures.LIMITS_HEADING)
    (out / "performance.md").write_text(document[:start] + document[end:])
    assert figures.main(["--quick", "--out-dir", str(out), "--sections", "storm"]) == 0
    after = (out / "performance.md").read_text()
    assert heading not in after
    assert (
        figures._kept_sections(after)["placement"] == figures._kept_sections(document)["placement"]
    )


def test_a_partial_run_needs_the_other_sections_to_exist(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        figures.main(["--quick", "--out-dir", str(tmp_path), "--sections", "storm"])


def test_the_scheduler_section_shows_before_and_now(tmp_path: Path) -> None:
    """The real-scheduler table from a benchmark document, against an earlier run's."""

    def document(names_pods_per_s: float) -> dict[str, object]:
        modes = {
            "none": {"pods_per_s_median": 200.0, "pods_per_s": [200.0], "ratio_to_none": 1.0},
            "names": {
                "pods_per_s_median": names_pods_per_s,
                "pods_per_s": [names_pods_per_s],
                "ratio_to_none": names_pods_per_s / 200.0,
                "scorer_ms_median": {"filter": 0.25, "prioritize": 0.2},
            },
        }
        return {
            "machine": "2 logical CPUs",
            "measured_at": "2026-12-01 20:00 UTC",
            "label": "the earlier scorer",
            "sizes": [
                {
                    "config": {"nodes": 300, "pods": 120, "rounds": 3},
                    "patches_per_s": 6.9,
                    "modes": modes,
                }
            ],
        }

    before, now = document(150.0), document(190.0)
    section = real_scheduler.markdown_section(
        now, command="python -m benchmarks.real_scheduler --json", before=before, plotted=True
    )
    row = next(line for line in section.splitlines() if "names only" in line)
    assert "| 190.0 " in row
    assert "| 0.95x " in row  # now
    assert "| 0.75x " in row  # before
    assert "6.9 patches/s at 300 nodes" in section
    assert "the earlier scorer (2026-12-01 20:00 UTC)" in section
    assert real_scheduler.plot(now, tmp_path / "plot.png", before=before)
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def _section_modules() -> list[Any]:
    """Every module of `benchmarks.sections` that defines a section."""
    names = [info.name for info in pkgutil.iter_modules(benchmarks.sections.__path__)]
    modules = [importlib.import_module(f"benchmarks.sections.{name}") for name in names]
    return [module for module in modules if hasattr(module, "SECTION")]


def test_every_section_module_is_listed_once() -> None:
    """A section module left out of `SECTIONS` would never run, and its kept text would be
    taken for a study written under the section before it."""
    defined = {module.SECTION.name: module.SECTION for module in _section_modules()}
    assert len(set(figures.NAMES)) == len(figures.NAMES)
    assert set(defined) == set(figures.NAMES)
    for section in figures.SECTIONS:
        assert defined[section.name] is section


def test_headings_and_steps_are_distinct() -> None:
    headings = [section.heading for section in figures.SECTIONS]
    assert len(set(headings)) == len(headings)
    for heading in headings:
        assert heading.startswith("## ")
        assert heading == heading.strip()
        assert "\n" not in heading
        assert not heading.startswith((figures.LIMITS_HEADING, figures.TIMING_HEADING))
    steps = [step for section in figures.SECTIONS for step in section.steps]
    assert all(steps)
    assert len(set(steps)) == len(steps)


def _timing_rows(document: str) -> list[str]:
    table = document.split(figures.TIMING_HEADING, 1)[1]
    return [
        line
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith(("| step ", "| --- "))
    ]


def test_the_committed_document_has_every_section_under_its_heading() -> None:
    """A heading spelt differently from the document's would drop that section from every
    partial run."""
    document = DOCUMENT.read_text()
    kept = figures._kept_sections(document)
    assert list(kept) == list(figures.NAMES)
    for section in figures.SECTIONS:
        assert kept[section.name].startswith(section.heading + "\n"), section.name
    # Every step of the timing table belongs to a section, so a partial run keeps it.
    assert len(figures._kept_timings(document, [])) == len(_timing_rows(document))


def test_each_simulated_section_owns_its_timing_rows(quick_run: Path) -> None:
    text = (quick_run / "performance.md").read_text()
    assert len(figures._kept_timings(text, [])) == len(_timing_rows(text))
    for name in ("fleet", "storm", "placement", "seeds"):
        others = [other for other in figures.NAMES if other != name]
        assert figures._kept_timings(text, others), name


def _placement(summary: Mapping[str, Any]) -> str:
    config = PlacementConfig(
        nodes=FULL.placement_nodes,
        duration_s=FULL.placement_duration_s,
        seed=figures.PLACEMENT_SEED,
    )
    return placement.render(summary["placement"], config, summary["placement_lag"])


def _scheduler(summary: Mapping[str, Any]) -> str:
    return real_scheduler.markdown_section(
        summary["real_scheduler"],
        command=command_line(
            scheduler.MODULE,
            scheduler.arguments(
                quick=False, modes=scheduler.measured_modes(summary["real_scheduler"])
            ),
        ),
        before=summary["real_scheduler_before"],
        plotted=True,
    )


def _profile(summary: Mapping[str, Any]) -> str:
    command = command_line(profile.MODULE, profile.arguments(quick=False))
    return scheduler_profile.markdown_section(summary["scheduler_profile"], command=command)


def _inflight(summary: Mapping[str, Any]) -> str:
    command = command_line(inflight.MODULE, inflight.arguments(quick=False))
    return pod_watch.markdown_section(summary["pod_watch"], command=command)


# The sections whose whole data figures.json keeps, each rendered as its `run` renders it. (The
# fleet and storm sections also read the simulations' time series, the agent and scorer
# sections their benchmarks' output: neither is kept there.)
FROM_SUMMARY: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "placement": _placement,
    "seeds": lambda summary: seeds.render(summary["placement_seeds"]),
    "scheduler": _scheduler,
    "profile": _profile,
    "inflight": _inflight,
}


@pytest.mark.parametrize("name", sorted(FROM_SUMMARY))
def test_the_committed_section_is_what_the_committed_data_renders(name: str) -> None:
    """docs/performance.md says to edit the code, not the document: the code must still
    render the document's text from the same data, byte for byte."""
    kept = figures._kept_sections(DOCUMENT.read_text())[name]
    by_hand = figures._studies(kept)
    written = kept[: len(kept) - len(by_hand)]
    rendered = FROM_SUMMARY[name](json.loads(SUMMARY.read_text()))
    assert rendered.rstrip() == written.rstrip(), (
        f"the {name} section of docs/performance.md is not what its code renders from "
        "docs/img/figures.json: regenerate it, or render it from that data"
    )
