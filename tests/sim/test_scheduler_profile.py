"""The scheduler profile's reading of `go tool pprof -top -cum`, on real kube-scheduler profiles."""

from __future__ import annotations

import pytest

from benchmarks.scheduler_profile import (
    PARTS,
    Profile,
    cumulative_shares,
    markdown_section,
    part_shares,
    sampled_cpu_s,
)
from tests.fixture_paths import SCHEDULER_FIXTURES

PPROF = SCHEDULER_FIXTURES / "pprof"


def _top(name: str) -> str:
    return (PPROF / name).read_text()


def test_reads_cumulative_shares_and_the_sampled_cpu() -> None:
    top = _top("full-top-cum.txt")
    shares = cumulative_shares(top)
    assert shares["k8s.io/kubernetes/pkg/scheduler.(*HTTPExtender).send"] == 76.86
    assert shares["encoding/json.(*Decoder).Decode"] == 46.57
    # Rows whose flat column is a bare 0 and rows with a flat time are both read.
    assert shares["encoding/json.(*Decoder).readValue"] == 18.57
    assert sampled_cpu_s(top) == 3.5


def test_each_part_of_the_loop_is_found_in_a_real_profile() -> None:
    names = part_shares(cumulative_shares(_top("names-top-cum.txt")), {})
    assert names["filter plugins"] == 21.01
    assert names["score plugins"] == 8.95
    assert names["binding"] == 8.95
    assert names["garbage collection"] == 12.06
    assert names["extender calls"] == 11.67
    full = part_shares(
        cumulative_shares(_top("full-top-cum.txt")),
        cumulative_shares(_top("full-top-cum-send.txt")),
    )
    assert full["extender calls"] == 76.86
    assert full["  decoding the reply (JSON)"] == 46.57
    assert full["  encoding the request (JSON)"] == pytest.approx(29.71)
    # What the focused profile does not show is 0, not carried over from the whole one.
    assert part_shares({}, {})["extender calls"] == 0.0


@pytest.mark.parametrize(
    ("line", "cpu_s"),
    [
        ("Duration: 8s, Total samples = 950ms (11.88%)", 0.95),
        ("Duration: 8.01s, Total samples = 12.40s (154.81%)", 12.4),
        ("no such line", 0.0),
    ],
)
def test_sampled_cpu_units(line: str, cpu_s: float) -> None:
    assert sampled_cpu_s(line) == pytest.approx(cpu_s)


def test_the_section_states_wall_time_and_cpu_per_pod() -> None:
    shares = {label: 10.0 for label, _, _ in PARTS}
    full = Profile("full", 200, 8.0, 15.0, pods_per_s=16.0, cpu_s=6.4, shares=shares)
    names = Profile("names", 900, 8.0, 160.0, pods_per_s=160.0, cpu_s=4.0, shares=shares)
    document = {
        "machine": "test machine",
        "measured_at": "2026-12-02 00:00 UTC",
        "nodes": 300,
        "profiles": [
            {field: getattr(p, field) for field in Profile.__slots__} for p in (names, full)
        ],
    }
    text = markdown_section(document, command="python -m benchmarks.scheduler_profile")
    # Full: 62.5 ms of wall time and 0.8 cores x 62.5 ms = 50 ms of CPU per pod.
    assert "Each pod takes 62.5 ms of wall time and 50.0 ms of the scheduler's CPU" in text
    # Names: 6.2 ms of wall time, 0.5 cores x 6.25 ms of CPU.
    assert "6.2 ms of wall time but only 3.1 ms of the scheduler's CPU" in text
    assert "| scheduler CPU (cores) | 0.50 | 0.80 |" in text
