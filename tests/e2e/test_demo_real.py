"""The demo's loop on the real control plane: `python3 dev.py demo --cluster real`."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from demo.loop import run
from demo.options import DemoOptions

# Headless, on the faster demo clock the stand-in demo's tests use.
FAST = DemoOptions(
    tui=False, sample_interval_s=0.5, min_write_interval_s=1.0, heartbeat_s=5.0, cluster="real"
)


@pytest.mark.parametrize("node_cache", [False, True], ids=["full-nodes", "names-only"])
def test_real_scheduler_places_the_demo_pods(node_cache: bool, control_plane_built: None) -> None:
    out = io.StringIO()
    options = replace(FAST, duration_s=6.0, nodes=4, seed=3, node_cache=node_cache, pods_per_s=3.0)
    outcome = run(options, out=out)
    final = outcome.final
    text = out.getvalue()
    assert final is not None, text
    assert final.pods_placed > 0, text
    assert final.pods_submitted >= final.pods_placed
    assert "real kube-scheduler" in final.mode
    assert all(n.writes >= 1 for n in final.nodes), text
    assert 0 < final.writes < final.samples
    for attempt in final.attempts:
        assert attempt.why
        if attempt.node is not None:
            assert attempt.node in {n.name for n in final.nodes}
            assert attempt.why == "bound by kube-scheduler"
    assert "kube-apiserver at https://127.0.0.1:" in text
