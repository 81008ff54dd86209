"""The Pod watch benchmark's arithmetic and readings: nothing here starts a control plane."""

from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import generate_latest

from benchmarks import pod_watch
from benchmarks.machine import cpu_seconds
from benchmarks.pod_watch import (
    GPU_POD_PERIOD,
    POD_EVENTS,
    POD_LIST_HELD,
    ChurnPlan,
    Histogram,
    PodPlan,
    ProcSample,
    build_parser,
    config_from,
    markdown_section,
    parse_metrics,
    pod_list_held_at,
    status_kib,
    summarize_rounds,
)
from exporter_scheduler.edges.podcache import PodCache
from exporter_scheduler.logs import JsonLogFormatter
from exporter_scheduler.serving.metrics import ScorerMetrics


@pytest.mark.parametrize(
    ("stat", "ticks_per_s", "cpu_s"),
    [
        pytest.param("42 (python) S 1 42 42 0 -1 0 900 0 0 0 150 50 0 0", 100, 2.0, id="plain"),
        # A command name may hold spaces and parentheses: the fields count from its last ')'.
        pytest.param("7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 1 0 0", 4, 1.0, id="odd-comm"),
    ],
)  # fmt: skip
def test_cpu_seconds_are_utime_plus_stime(stat: str, ticks_per_s: int, cpu_s: float) -> None:
    assert cpu_seconds(stat, ticks_per_s) == cpu_s


def test_status_lines_are_read_in_kib_and_a_missing_one_says_which() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert status_kib(status, "VmRSS") == 102400
    assert status_kib(status, "VmHWM") == 204800
    with pytest.raises(KeyError, match="VmSwap"):
        status_kib(status, "VmSwap")


def test_this_process_reads_as_a_sample() -> None:
    sample = ProcSample.read(os.getpid())
    assert sample.cpu_s > 0
    assert 0 < sample.rss_mib <= sample.hwm_mib


def test_event_times_come_from_the_scorers_own_histogram() -> None:
    """Mean and p99 bound over an interval, from the text the scorer's /metrics renders."""
    metrics = ScorerMetrics()
    for seconds in (0.003, 0.003):  # before the interval
        metrics.pod_cache_event_seconds.observe(seconds)
    before = Histogram.of(parse_metrics(generate_latest(metrics.registry).decode()), POD_EVENTS)
    for seconds in [0.00004] * 98 + [0.0002, 0.02]:
        metrics.pod_cache_event_seconds.observe(seconds)
    after = Histogram.of(parse_metrics(generate_latest(metrics.registry).decode()), POD_EVENTS)
    interval = after.since(before)
    assert interval.count == 100
    assert interval.mean_us() == pytest.approx((98 * 40 + 200 + 20_000) / 100)
    assert interval.quantile_bound_us(0.5) == pytest.approx(50)  # the 50 us bucket
    assert interval.quantile_bound_us(0.99) == pytest.approx(250)
    assert interval.quantile_bound_us(1.0) == float("inf")  # 20 ms: past the last bucket
    assert Histogram.of({}, POD_EVENTS).mean_us() is None
    assert Histogram.of({}, POD_EVENTS).quantile_bound_us(0.99) is None


def test_the_pod_list_time_is_the_pod_caches_own_log_line() -> None:
    """The line the benchmark waits for is the one the pod cache writes when its LIST is held,
    in the scorer's JSON log format."""
    assert f'"{POD_LIST_HELD}"' in inspect.getsource(PodCache._set_active)
    record = logging.LogRecord("exporter_scheduler.podcache", logging.INFO, "", 0, "", (), None)
    record.msg, record.created = POD_LIST_HELD, 1_800_000_000.25
    other = logging.LogRecord("x", logging.INFO, "", 0, "serving", (), None)
    text = "\n".join(JsonLogFormatter().format(r) for r in (other, record)) + "\nnot json"
    assert pod_list_held_at(text) == datetime.fromtimestamp(1_800_000_000.25, UTC)
    assert pod_list_held_at(JsonLogFormatter().format(other)) is None


def _round(**pairs: tuple[float | None, float | None]) -> dict[str, Any]:
    scorers: dict[str, dict[str, float | None]] = {"with_watch": {}, "no_watch": {}}
    for measure in pod_watch.MEASURES:
        with_watch, no_watch = pairs.get(measure, (0.0, 0.0))
        scorers["with_watch"][measure] = with_watch
        scorers["no_watch"][measure] = no_watch
    return {"scorers": scorers}


def test_the_cost_is_the_median_of_each_rounds_difference() -> None:
    rounds = [
        _round(cpu_churn_s=(10.0, 1.0), pod_list_s=(4.0, None)),
        _round(cpu_churn_s=(3.0, 2.0), pod_list_s=(6.0, None)),
        _round(cpu_churn_s=(5.0, 4.0), pod_list_s=(5.0, None)),
    ]
    summary = summarize_rounds(rounds)
    # Differences 9, 1, 1: median 1; the medians' difference (5 - 2 = 3) would overstate it.
    assert summary["cpu_churn_s"] == {"with_watch": 5.0, "no_watch": 2.0, "cost": 1.0}
    # Measured by one scorer only: its median, and no cost.
    assert summary["pod_list_s"] == {"with_watch": 5.0, "no_watch": None, "cost": None}


def test_pods_spread_over_the_nodes_and_one_in_five_asks_for_no_gpu() -> None:
    plans = [PodPlan.of(i, 50) for i in range(1000)]
    assert sum(p.gpus == 0 for p in plans) == 1000 // GPU_POD_PERIOD
    assert len({p.node for p in plans}) == 50
    assert len({p.name for p in plans}) == 1000
    assert PodPlan.of(17, 50) == plans[17]  # the same index, the same pod
    pod = pod_watch.pod_object(plans[0])
    assert pod["spec"]["nodeName"] == plans[0].node
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    loader = pod_watch.pod_object(plans[GPU_POD_PERIOD - 1])
    containers = loader["spec"]["containers"] + loader["spec"]["initContainers"]
    assert not any("nvidia.com/gpu" in str(c["resources"]) for c in containers)
    # With --labelled, the GPU pods (only) carry the label the chart's admission policy sets.
    label = "gpu-scheduler.example.com/gpu-pod"
    assert label not in pod["metadata"]["labels"]
    assert pod_watch.pod_object(plans[0], labelled=True)["metadata"]["labels"][label] == "true"
    assert (
        label
        not in pod_watch.pod_object(plans[GPU_POD_PERIOD - 1], labelled=True)["metadata"]["labels"]
    )


def test_the_labelled_scorers_cost_is_against_the_scorer_without_a_watch() -> None:
    rounds = [_round(cpu_to_ready_s=(9.0, 2.0)), _round(cpu_to_ready_s=(11.0, 1.0))]
    for r, labelled in zip(rounds, (3.0, 4.0), strict=True):
        r["scorers"][pod_watch.LABELLED] = dict.fromkeys(pod_watch.MEASURES, 0.0)
        r["scorers"][pod_watch.LABELLED]["cpu_to_ready_s"] = labelled
    summary = summarize_rounds(rounds)["cpu_to_ready_s"]
    assert (summary[pod_watch.LABELLED], summary["labelled_cost"]) == (3.5, 2.0)
    assert summary["cost"] == 8.5


def test_churn_replaces_pods_one_write_in_four_a_create() -> None:
    plan = ChurnPlan(running=range(1000), next_index=1000, seed=3)
    ops = [plan.next(t * 0.02) for t in range(4000)]  # 80 s at 50 writes/s
    counts = Counter(op for op, _ in ops)
    # Each create brings a delete and, 2 s and 5 s later, its two status patches.
    assert counts["create"] == counts["delete"]
    assert abs(counts["admit"] - counts["create"]) <= 2.0 / 0.02 / 4 + 1
    assert abs(counts["run"] - counts["create"]) <= 5.0 / 0.02 / 4 + 1
    deleted = [index for op, index in ops if op == "delete"]
    assert len(deleted) == len(set(deleted))  # none twice
    created = {index for op, index in ops if op == "create"}
    started = {index for op, index in ops if op == "run"}
    # A pod is deleted once it runs (a fleet pod, or a churned one past its run patch).
    assert all(index < 1000 or index in started for index in deleted)
    assert created == set(range(1000, plan.next_index))
    # The patches still due when the churn stops are handed back to be written.
    left = plan.pending()
    assert {op for op, _ in left} <= {"admit", "run"}
    assert {index for op, index in left if op == "run"} == created - started
    assert plan.pending() == []


def test_churn_deletes_nothing_while_no_pod_runs_yet() -> None:
    plan = ChurnPlan(running=(), next_index=0, seed=1)
    assert [plan.next(0.0), plan.next(0.1), plan.next(0.2)] == [
        ("create", 0),
        ("create", 1),
        ("create", 2),
    ]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        pytest.param(["--nodes", "0"], "at least 1", id="no-nodes"),
        pytest.param(["--rounds", "0"], "at least 1", id="no-rounds"),
        pytest.param(["--churn-per-s", "0"], "positive", id="no-churn"),
        pytest.param(["--duration-s", "-1"], "positive", id="negative-duration"),
        pytest.param(["--pods", "3"], "ask for no GPU", id="too-few-pods"),
        pytest.param([], None, id="defaults"),
    ],
)
def test_arguments(argv: list[str], error: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if error is None:
        assert config_from(parser, args) == pod_watch.Config()
        return
    with pytest.raises(SystemExit):
        config_from(parser, args)
    assert error in capsys.readouterr().err


def test_sizes_come_from_the_flags() -> None:
    parser = build_parser()
    argv = ["--nodes", "200", "--pods", "2000", "--churn-per-s", "25"]
    argv += ["--duration-s", "20", "--rounds", "2"]
    assert config_from(parser, parser.parse_args(argv)) == pod_watch.Config(
        nodes=200, pods=2000, churn_per_s=25.0, duration_s=20.0, rounds=2
    )


def test_the_section_reports_the_cost_per_core_and_per_pod() -> None:
    rounds = [
        _round(
            cpu_churn_s=(13.0, 1.0),
            cpu_churn_cores=(0.108, 0.008),
            rss_end_mib=(400.0, 100.0),
            pods_held=(40_000.0, 0.0),
            pod_event_p99_us=(float("inf"), None),
        )
    ]
    for r in rounds:
        r["churn"] = {"writes_per_s": 49.5, "errors": 0, "patches_per_s": 101.0}
    document = {
        "machine": "2 logical CPUs",
        "measured_at": "2026-12-02 10:00 UTC",
        "config": {"nodes": 5000, "pods": 50_000, "duration_s": 120.0},
        "gpu_pods": 40_000,
        "patches_per_s": 110.0,
        "load_1m": {"min": 2.5, "median": 3.25, "max": 6.0},
        "rounds": rounds,
        "summary": summarize_rounds(rounds),
    }
    section = markdown_section(document, command="python -m benchmarks.pod_watch")
    assert section.startswith(pod_watch.HEADING)
    assert "the watch costs 10.0% of a core at 49.5 pod writes/s" in section
    # The churn windows' own patch rate, not the run's average, and how busy the machine was.
    assert "patched at 101/s" in section
    assert "load average during the rounds: median 3.2 (2.5 to 6.0)" in section
    assert "300 MiB of RSS for 40,000 GPU pods held (7.7 KiB a pod, the whole" in section
    row = next(line for line in section.splitlines() if line.startswith("| CPU during"))
    assert [c.strip() for c in row.strip("|").split("|")][1:] == ["13.0", "1.0", "12.0"]
    assert "| > 10,000 " in section  # a p99 past the histogram's last bucket


@pytest.mark.parametrize("share", [0.2, 0.5, 0.8, 1.0])
def test_the_gpu_share_is_the_share_of_pods_that_ask_for_gpus(share: float) -> None:
    plans = [PodPlan.of(i, 50, share) for i in range(1000)]
    assert sum(p.gpus > 0 for p in plans) == round(1000 * share)
