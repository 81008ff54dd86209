"""Where the real wire captures live: a kube-scheduler and a kube-apiserver, v1.36 and v1.37.

They are data recorded from real servers (see each folder's README.md), kept in the repository so
that the golden and contract tests run on any clone.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The full v1.36 sets: every case the tests name by file (error replies, watches, compaction).
SCHEDULER_FIXTURES = FIXTURES / "kube-scheduler-v1.36"
APISERVER_FIXTURES = FIXTURES / "kube-apiserver-v1.36"
# v1.37.2, the default control plane's: every exchange recorded again, by loopback_cluster.capture
# and (the watches, compaction, restart and credential cases) loopback_cluster.capture_watch;
# their README says how they differ from v1.36. Tests that replay every capture read both.
SCHEDULER_FIXTURES_V137 = FIXTURES / "kube-scheduler-v1.37"
APISERVER_FIXTURES_V137 = FIXTURES / "kube-apiserver-v1.37"
SCHEDULER_CAPTURES = (SCHEDULER_FIXTURES, SCHEDULER_FIXTURES_V137)
