"""The one-command demo, run headless for a few seconds with every part real.

The run is short and uses a faster demo clock (agents sample every 0.5 s), so the whole file stays
within a few seconds per run; what it checks are the summary's facts, not timings.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from agent.simulated import SimulatedSource
from demo import loop
from demo.loop import parse_args, plan_fleet, run
from demo.options import DemoOptions
from demo.parts import SimulatedLoad
from demo.tui import DemoSnapshot, LatencyFigures, NodeView, render, summary_lines
from kube_standins.scheduler_driver import Attempt, PodSpec

# Headless, on a faster demo clock than the default show.
FAST = DemoOptions(tui=False, sample_interval_s=0.5, min_write_interval_s=1.0, heartbeat_s=5.0)


def _live_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    before = _live_threads()
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        leaked = _live_threads() - before
        if not leaked:
            return
        time.sleep(0.05)
    raise AssertionError(f"threads left running: {sorted(t.name for t in leaked)}")


@pytest.mark.parametrize(
    "node_cache",
    [pytest.param(False, id="full-nodes"), pytest.param(True, id="names-only-node-cache")],
)
def test_headless_run_places_pods_with_reasons(node_cache: bool, no_leaked_threads: None) -> None:
    out = io.StringIO()
    options = replace(FAST, duration_s=3.0, nodes=4, seed=3, node_cache=node_cache, pods_per_s=4.0)
    outcome = run(options, out=out)
    text = out.getvalue()
    final = outcome.final
    assert final is not None
    assert not outcome.interrupted

    assert final.pods_placed > 0
    assert final.pods_submitted >= final.pods_placed
    # Rate limiting: the agents sampled more often than they wrote, and wrote at least once each.
    assert all(n.writes >= 1 for n in final.nodes)
    assert 0 < final.writes < final.samples
    # Every pod the scheduler tried has a recorded reason, and placed pods name their node.
    assert final.attempts
    for attempt in final.attempts:
        assert attempt.why
        if attempt.node is not None:
            assert attempt.node in {n.name for n in final.nodes}
    assert final.latency is not None
    assert 0 < final.latency.p50_ms <= final.latency.p99_ms <= final.latency.max_ms
    # The plain output: node writes, placements with reasons, and the summary.
    assert "annotations written: util=" in text
    assert " -> gpu-" in text
    assert "extender latency: p50 " in text
    assert f"agent writes: {final.writes} made vs {final.samples} samples taken" in text


def test_ctrl_c_stops_every_part(monkeypatch: pytest.MonkeyPatch, no_leaked_threads: None) -> None:
    def interrupted(_demo: loop.Demo, _out: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "_run_plain", interrupted)
    out = io.StringIO()
    started = time.monotonic()
    outcome = run(replace(FAST, duration_s=30.0, nodes=2), out=out)
    assert outcome.interrupted
    assert outcome.final is not None
    assert time.monotonic() - started < 15.0
    assert "interrupted: every server and thread stopped" in out.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--duration", "0"], id="zero-duration"),
        pytest.param(["--nodes", "0"], id="no-nodes"),
        pytest.param(["--pods-per-s", "-1"], id="negative-rate"),
        pytest.param(["--sample-interval", "5", "--min-write-interval", "2"], id="bad-order"),
    ],
)
def test_bad_flags_are_refused_with_a_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "must be" in err or "need" in err


def test_defaults_make_a_one_minute_live_show() -> None:
    options = parse_args([])
    assert options.tui
    assert options.duration_s == 60.0
    assert options.node_cache  # names only, as the chart deploys the scorer
    flags = parse_args(["--no-tui", "--no-node-cache", "--nodes", "12", "--seed", "9"])
    assert (flags.tui, flags.node_cache, flags.nodes, flags.seed) == (False, False, 12, 9)


def test_fleet_mixes_models_and_starts_with_the_preference_chain() -> None:
    plans = plan_fleet(8)
    assert [p.name for p in plans[:2]] == ["gpu-a100-0", "gpu-v100-1"]
    assert len({p.product for p in plans}) >= 4
    assert len({p.name for p in plans}) == 8


def _snapshot() -> DemoSnapshot:
    prefix = "gpu-scheduler.example.com/"
    node = NodeView(
        name="gpu-a100-0",
        model="A100",
        gpus_total=8,
        gpus_used=3,
        annotations={prefix + "utilization": "0.93", prefix + "health": "ok"},
        data_age_s=4.2,
        writes=3,
        samples=9,
    )
    other = NodeView("gpu-v100-1", "V100", 8, 0, {prefix + "utilization": "0.20"}, 1.0, 2, 9)
    pod = PodSpec(
        name="train-0001",
        uid="u",
        gpus=2,
        run_s=10.0,
        utilization=0.8,
        annotations={
            prefix + "gpu-model-preference": "A100,V100",
            prefix + "gpu-fallback-utilization": "0.80",
        },
    )
    placed = Attempt(
        pod,
        2.0,
        "gpu-v100-1",
        "only node left after the filter",
        {"gpu-a100-0": "gpu utilization above 0.90"},
        {},
        ("gpu-a100-0", "gpu-v100-1"),
        False,
    )
    waiting = Attempt(
        PodSpec("train-0002", "v", 8, 5.0, 0.9),
        3.0,
        None,
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        {"gpu-a100-0": "Insufficient nvidia.com/gpu", "gpu-v100-1": "Insufficient nvidia.com/gpu"},
        {},
        (),
        False,
    )
    return DemoSnapshot(
        elapsed_s=5.0,
        duration_s=60.0,
        mode="full nodes",
        extender_url="http://127.0.0.1:1234",
        settings_line="demo clock",
        nodes=[node, other],
        attempts=[placed, waiting],
        pods_submitted=2,
        pods_placed=1,
        pods_pending=1,
        pods_running=1,
        pods_finished=0,
        latency=LatencyFigures(count=3, p50_ms=1.5, p99_ms=2.5, max_ms=2.5),
        focus_node="gpu-a100-0",
    )


def test_live_view_shows_nodes_annotations_and_pods() -> None:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(render(_snapshot()))
    screen = console.export_text()
    assert "kubectl describe node gpu-a100-0" in screen
    assert "gpu-scheduler.example.com/utilization: 0.93" in screen
    assert "train-0001" in screen
    assert "1 gpu utilization above 0.90" in screen
    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu." in screen
    assert "3/9" in screen
    assert "writes: patches that reached the API server" in screen


def test_summary_counts_fallbacks_and_latency() -> None:
    lines = summary_lines(_snapshot())
    joined = "\n".join(lines)
    assert "agent writes: 5 made vs 18 samples taken (28% of samples)" in joined
    assert "model-preference fallbacks: 1" in joined
    assert "p50 1.50 ms, p99 2.50 ms" in joined


def test_rendering_is_a_pure_function_of_the_snapshot() -> None:
    first = Console(record=True, width=160, file=io.StringIO())
    second = Console(record=True, width=160, file=io.StringIO())
    first.print(render(_snapshot()))
    second.print(render(_snapshot()))
    assert first.export_text() == second.export_text()


def test_bound_pods_load_their_node_and_the_load_leaves_with_them() -> None:
    start = datetime(2026, 11, 30, 15, 0, 0, tzinfo=UTC)
    clock = [start]
    source = SimulatedSource(gpus=8, model="NVIDIA A100-SXM4-80GB", seed=1, start=start)
    quiet = SimulatedSource(gpus=8, model="NVIDIA A100-SXM4-80GB", seed=1, start=start)
    load = SimulatedLoad({"node": source}, clock=lambda: clock[0])
    prefix = "gpu-scheduler.example.com/"
    big = PodSpec("big", "u1", 4, 10.0, 0.8, {prefix + "min-gpu-memory-mib": "40000"})
    small = PodSpec("small", "u2", 2, 10.0, 0.4)

    def mean_util(src: SimulatedSource, at: datetime) -> float:
        gpus = src.read(at).gpus
        return sum(g.utilization or 0.0 for g in gpus) / len(gpus)

    def free_mib(src: SimulatedSource, at: datetime) -> int:
        return sum(g.memory_free_mib or 0 for g in src.read(at).gpus)

    load.pod_started("node", big)
    load.pod_started("node", small)
    later = start + timedelta(seconds=1)
    # 4 GPUs at 0.8 and 2 at 0.4 on 8 GPUs: +0.5 on the node's mean (capped per GPU at 1).
    assert mean_util(source, later) > mean_util(quiet, later)
    assert free_mib(quiet, later) - free_mib(source, later) == 4 * 40000 + 2 * 8192
    clock[0] = start + timedelta(seconds=2)
    load.pod_ended("node", big)
    load.pod_ended("node", small)
    after = start + timedelta(seconds=3)
    assert mean_util(source, after) == pytest.approx(mean_util(quiet, after))
    assert free_mib(source, after) == free_mib(quiet, after)
    # A pod on a node the demo has no source for is ignored, not an error.
    load.pod_started("elsewhere", small)
