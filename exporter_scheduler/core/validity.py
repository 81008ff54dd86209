"""Validity windows: for how long the passage of time alone cannot change a verdict.

A verdict is a pure function of (pod, node data, in-flight pods, now, policy), and `now` moves
it only at a few boundaries: a node's data turning stale, its clock skew ending, an in-flight pod
no longer counting. The caches that keep verdicts between requests (the names-only node store)
read these windows to know when a kept verdict must be judged again; `evaluate` reports the
earliest boundary as `Evaluation.valid_until`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from exporter_scheduler.core.inflight import InFlight
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import NodeVerdict

# Verdict boundaries are compared in float seconds; stopping a millisecond short of the exact
# boundary keeps rounding from ever placing a changed verdict inside a validity window.
VALIDITY_MARGIN_S: Final = 0.001
_VALIDITY_MARGIN: Final = timedelta(seconds=VALIDITY_MARGIN_S)


def time_left_s(
    age_s: float | None,
    server_age_s: float | None,
    stale_s: float,
    skew_s: float,
    inflight: InFlight | None = None,
) -> float:
    """Seconds until time alone changes one node's verdict; `inf` when no boundary lies ahead.

    Only freshness depends on `now`: a node turns stale once `age_s` or `server_age_s` exceeds
    `stale_s`, and stops being clock skew once `-age_s` no longer exceeds `skew_s` (the
    managedFields lag check compares two stored times and does not move). Each remaining time is
    `threshold - current`; a negative one is a boundary already passed, which time cannot cross
    again. Boundaries that do not apply to a node (a stale node's skew one, say) only make the
    answer earlier, which is safe. An in-flight pod stops counting when its time bound ends.
    """
    left_s = math.inf if inflight is None else inflight.left_s
    if age_s is not None:
        remaining = stale_s - age_s
        if 0 <= remaining < left_s:
            left_s = remaining
        remaining = -age_s - skew_s
        if 0 <= remaining < left_s:
            left_s = remaining
    if server_age_s is not None:
        remaining = stale_s - server_age_s
        if 0 <= remaining < left_s:
            left_s = remaining
    return left_s


def time_since_s(
    age_s: float | None,
    server_age_s: float | None,
    stale_s: float,
    skew_s: float,
    inflight: InFlight | None = None,
) -> float:
    """Seconds since the last of the same boundaries (`inf` when none lies behind): going back
    in time no further than this, the verdict was the same. See `time_left_s`."""
    since_s = math.inf if inflight is None else inflight.since_s
    if age_s is not None:
        elapsed = age_s - stale_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
        elapsed = age_s + skew_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
    if server_age_s is not None:
        elapsed = server_age_s - stale_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
    return since_s


def validity_window(verdict: NodeVerdict, now_ts: float, c: PodClass) -> tuple[float, float]:
    """`[from, until)` in POSIX seconds around `now_ts` (when `verdict` was judged) in which
    time alone cannot change it, a millisecond short of each boundary; unbounded sides are
    infinite. `now_ts` itself always lies inside, unless a boundary is exactly at `now_ts`."""
    stale_s, skew_s = c.policy.stale_after_s, c.policy.clock_skew_tolerance_s
    inflight = verdict.inflight
    left_s = time_left_s(verdict.age_s, verdict.server_age_s, stale_s, skew_s, inflight)
    since_s = time_since_s(verdict.age_s, verdict.server_age_s, stale_s, skew_s, inflight)
    from_ts = min(now_ts, now_ts - since_s + VALIDITY_MARGIN_S)
    return from_ts, now_ts + left_s - VALIDITY_MARGIN_S


def valid_until(verdicts: Sequence[NodeVerdict], now: datetime, c: PodClass) -> datetime | None:
    """The earliest time-driven change of any verdict (see `Evaluation.valid_until`)."""
    stale_s = c.policy.stale_after_s
    skew_s = c.policy.clock_skew_tolerance_s
    left_s = min(
        (time_left_s(v.age_s, v.server_age_s, stale_s, skew_s, v.inflight) for v in verdicts),
        default=math.inf,
    )
    if left_s == math.inf:
        return None
    return now + timedelta(seconds=left_s) - _VALIDITY_MARGIN
