"""The figures command: a quick end-to-end run into a temporary folder, and its failure paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import figures


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
    for heading in (
        "## Write budget at fleet scale",
        "## A 429 storm",
        "## Scheduling quality",
        "## Agent tick and memory",
        "## Scorer latency",
    ):
        assert heading in text
    assert "python3 dev.py figures" in text
    assert "Quick smoke run" in text
    # Skipped benchmarks are said to be skipped, not silently left out.
    assert text.count("skipped (--no-benchmarks)") == 2
    for image in ("writes_vs_fleet", "data_age", "storm", "placement", "fragmentation"):
        assert f"(img/{image}.png)" in text


def test_missing_benchmark_is_reported_not_raised() -> None:
    outcome = figures.run_benchmark("benchmarks.no_such_benchmark", [], timeout_s=60)
    assert "error" in outcome
    assert "no_such_benchmark" in outcome["command"]
    section = figures._agent_section(outcome)
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
    }
    section = figures._agent_section({"data": data, "command": "python -m x --json"})
    assert "| 8 | 0.050 | 0.070 | 0.050 | 0.080 | 0.090 | 0.200 | 0.200 | 9/100 |" in section
    assert "plain `python`: peak RSS **81.5 MB** after 6.0 s (**missed**" in section
    assert "`python -OO`: peak RSS **61.5 MB** after 6.0 s (met" in section


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
                row["after_event_us"] = 25.0
                row["before_event_us"] = 20.0
                row["classes_event_us"] = {"after": 40.0, "before": 20.0}
                row["churn_nodes"] = 100
            rows.append(row)
    path = tmp_path / "latency.png"
    assert figures.fig_scorer_latency(rows, path)
    assert path.stat().st_size > 0
    assert not figures.fig_scorer_latency([{"mode": "full"}], tmp_path / "none.png")
    targets = [{"target": "names-only filter server time <= 0.3 ms", "value": 0.5, "met": False}]
    data = {"rows": rows, "targets": targets, "trees": ["after", "before"], "before": "abc123"}
    section = figures._scorer_section({"data": data, "command": "c"}, plotted=True)
    assert "scorer_latency.png" in section
    assert "**missed**: names-only filter server time <= 0.3 ms" in section
    assert "| names | 500 | filter | 1.50 | 0.50 | 0.45 | 3.0 x |" in section
    assert "`abc123`" in section
    assert "0.44 %" in section  # 40 us x 110 events/s of one core
