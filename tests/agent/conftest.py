"""Fixtures for every agent test: no `GPU_AGENT_*` setting leaks in from the environment, and the
log handler `main()` installs on the root logger does not leak out."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from agent.settings import AgentSettings, env_names


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AgentSettings.model_fields:
        for env in env_names(name):
            monkeypatch.delenv(env, raising=False)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if h.get_name() == "gpu-agent"]:
        root.removeHandler(handler)
    root.setLevel(level)
