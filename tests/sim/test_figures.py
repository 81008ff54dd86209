"""The figures command: a quick end-to-end run into a temporary folder, and its failure paths."""

from __future__ import annotations

import shutil
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
        "rss_no_pod_resources": {"seconds": 6.0, "peak_rss_mb": 70.0},
    }
    section = figures._agent_section({"data": data, "command": "python -m x --json"})
    assert "| 8 | 0.050 | 0.070 | 0.050 | 0.080 | 0.090 | 0.200 | 0.200 | 9/100 |" in section
    assert "(grpc loaded): peak RSS **81.5 MB** after 6.0 s (**missed**" in section
    assert (
        "`python -OO`, allocations from a kubelet stand-in (grpc loaded): peak RSS **61.5 MB**"
        in section
    )
    assert "`--pod-resources=false` (no grpc): peak RSS **70.0 MB** after 6.0 s (met" in section
    assert "python -OO`, `--pod-resources=false`" not in section  # not measured: not shown


def test_scorer_latency_figure_from_rows(tmp_path: Path) -> None:
    rows = [
        {
            "mode": mode,
            "nodes": nodes,
            "body_bytes": nodes * 6500,
            "filter": {"median_ms": nodes / 1000, "p99_ms": nodes / 500},
            "floor": {"median_ms": nodes / 1500, "p99_ms": nodes / 900},
            "naive": {"median_ms": nodes / 50, "p99_ms": nodes / 40},
            "round_trip": {"median_ms": nodes / 800, "p99_ms": nodes / 400},
        }
        for mode in ("full", "names")
        for nodes in (100, 500, 1000, 5000)
    ]
    path = tmp_path / "latency.png"
    assert figures.fig_scorer_latency(rows, path)
    assert path.stat().st_size > 0
    assert not figures.fig_scorer_latency([{"mode": "full"}], tmp_path / "none.png")
    targets = [{"target": "round trip <= 3.3 ms", "value": 4.0, "met": False}]
    section = figures._scorer_section(
        {"data": {"rows": rows, "targets": targets}, "command": "c"}, plotted=True
    )
    assert "scorer_latency.png" in section
    assert "| full | 5,000 | 32.50 | 3.33 | 5.00 | 10.00 |" in section
    assert "**missed**: round trip <= 3.3 ms (measured 4.0)" in section


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
    for name in ("fleet", "placement", "agent", "scorer"):
        assert again[name] == kept[name], name
    assert "Partly regenerated" in after
    assert "--sections storm" in after
    # The kept sections keep the date and machine they were measured on.
    dated = before.split("These numbers: ", 1)[1].split(" UTC on", 1)[0]
    assert f"These numbers: {dated} UTC on" in after
    # The kept sections' steps stay in the timing table beside the storm's new one.
    assert "placement: " in after.split("## Regeneration time", 1)[1]


def test_a_partial_run_needs_the_other_sections_to_exist(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        figures.main(["--quick", "--out-dir", str(tmp_path), "--sections", "storm"])
