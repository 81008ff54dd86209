"""What the demo is asked to run: its options and the nodes it plans.

They sit apart from the orchestration (`demo.loop`) so that the parts it starts (`demo.parts`)
can take them without importing the module that imports the parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class DemoOptions:
    duration_s: float = 60.0
    nodes: int = 8
    seed: int = 7
    node_cache: bool = True
    tui: bool = True
    pods_per_s: float = 1.0
    # The demo's clock runs the agents faster than production (5 s / 10 s / 60 s), so a minute
    # shows many write decisions; the rules are the same.
    sample_interval_s: float = 1.0
    min_write_interval_s: float = 2.0
    heartbeat_s: float = 10.0
    extender_weight: int = 5
    refresh_per_s: float = 4.0
    # "standin": the embedded API stand-in and scheduler driver (needs only Python); "real":
    # kube-apiserver and kube-scheduler v1.37 from `python3 dev.py cluster build`.
    cluster: Literal["standin", "real"] = "standin"

    def settings_line(self) -> str:
        return (
            f"demo clock: agents sample every {self.sample_interval_s:g}s, write at most every "
            f"{self.min_write_interval_s:g}s, heartbeat {self.heartbeat_s:g}s "
            f"(production defaults 5s / 10s / 60s), scorer stale-after {3 * self.heartbeat_s:g}s; "
            f"{self.pods_per_s:g} pods/s, seed {self.seed}"
        )


@dataclass(frozen=True, slots=True)
class NodePlan:
    name: str
    product: str
    gpus: int
