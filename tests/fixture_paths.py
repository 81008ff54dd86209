"""Where the real wire captures live: copies of a kube-scheduler and a kube-apiserver v1.36.

They are data recorded from real servers (see each folder's README.md), kept in the repository so
that the golden and contract tests run on any clone.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEDULER_FIXTURES = FIXTURES / "kube-scheduler-v1.36"
APISERVER_FIXTURES = FIXTURES / "kube-apiserver-v1.36"
