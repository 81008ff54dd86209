"""The real NVML source on a real GPU: run with `pytest -m gpu` (skipped where NVML cannot start).

What can be asserted without knowing the machine: every GPU NVML reports is read or reported
lost, each value is physically plausible, utilization comes from the sample buffer across ticks,
and close() shuts NVML down cleanly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.aggregate import aggregate
from agent.sources import GpuSource, SourceUnavailable, open_source
from gpu_contract.schema import Health, encode

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def source() -> Iterator[GpuSource]:
    try:
        opened = open_source("nvml")
    except SourceUnavailable as unavailable:
        pytest.skip(f"no usable NVML here: {unavailable}")
    yield opened
    opened.close()


def test_every_gpu_is_read_with_plausible_values(source: GpuSource) -> None:
    reading = source.read(datetime.now(UTC))
    assert reading.fatal is None
    assert reading.device_count >= 1
    assert len(reading.gpus) + len(reading.lost) == reading.device_count
    assert len({g.uuid for g in reading.gpus}) == len(reading.gpus)
    for gpu in reading.gpus:
        print(gpu)  # shown with -s: the values the prepared check reports
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.name
        assert gpu.memory_total_mib is not None
        assert gpu.memory_total_mib > 1024
        if gpu.memory_free_mib is not None:
            assert 0 <= gpu.memory_free_mib <= gpu.memory_total_mib
            # The biggest single request: all the free memory unless MIG splits it.
            assert gpu.memory_largest_allocation_mib is not None
            if gpu.mig_enabled:
                assert gpu.memory_largest_allocation_mib <= gpu.memory_free_mib
            else:
                assert gpu.memory_largest_allocation_mib == gpu.memory_free_mib
        if gpu.utilization is not None:
            assert 0.0 <= gpu.utilization <= 1.0
        if gpu.temperature_c is not None:
            assert 0 < gpu.temperature_c < 120
        assert gpu.mig_enabled is not None


def test_aggregate_of_a_real_reading(source: GpuSource) -> None:
    state = aggregate(source.read(datetime.now(UTC)))
    assert state.health in (Health.OK, Health.DEGRADED), state.health_detail
    assert state.gpu_count is not None
    assert state.gpu_count >= 1
    assert state.gpu_model
    annotations = encode(state)
    print(json.dumps(annotations, indent=2))
    assert annotations["gpu-scheduler.example.com/schema-version"] == "1"
    # The per-GPU keys, one value per GPU, from the same reads as the node keys.
    for key in ("per-gpu-utilization", "per-gpu-memory-free-mib", "per-gpu-temperature"):
        values = annotations["gpu-scheduler.example.com/" + key].split(",")
        assert len(values) == state.gpu_count, key
    temperatures = [
        int(t)
        for t in annotations["gpu-scheduler.example.com/per-gpu-temperature"].split(",")
        if t != "-"
    ]
    assert max(temperatures) == state.temperature_c


def test_consecutive_ticks_keep_reading(source: GpuSource) -> None:
    # The driver fills its utilization sample buffer every ~1/6 s; ticks 0.5 s apart must each
    # find fresh samples or fall back to the current rate, never fail.
    readings = []
    for _ in range(4):
        time.sleep(0.5)
        readings.append(source.read(datetime.now(UTC)))
    for reading in readings:
        assert reading.fatal is None
        assert all(g.utilization is not None or g.problems for g in reading.gpus)


def test_close_is_idempotent() -> None:
    try:
        opened = open_source("nvml")
    except SourceUnavailable as unavailable:
        pytest.skip(f"no usable NVML here: {unavailable}")
    opened.close()
    opened.close()
    # A closed source reads nothing, and says so, instead of calling NVML after nvmlShutdown.
    after = opened.read(datetime.now(UTC))
    assert after.fatal == "source closed"
    assert after.gpus == ()


def test_gpu_agent_once_dry_run_on_nvml(source: GpuSource) -> None:
    # The CLI also needs the kubernetes client and the rest; a bare GPU box may lack them.
    pytest.importorskip("agent.cli", reason="the agent CLI or its dependencies are not installed")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "once",
            "--source",
            "nvml",
            "--dry-run",
            "--output",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    print(json.dumps(printed, indent=2))
    assert printed["annotations"]["gpu-scheduler.example.com/health"] in ("ok", "degraded")
