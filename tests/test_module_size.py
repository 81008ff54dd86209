"""No product module over 600 lines: past that a module holds more than one concern, and its
reader has to hold them all at once. Split by concern, not by line count (see test_layering for
where each concern may live)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT: Final = ("agent", "exporter_scheduler", "gpu_contract")
MAX_LINES: Final = 600


def oversized(paths: list[Path], max_lines: int = MAX_LINES) -> dict[str, int]:
    """Each file of `paths` longer than `max_lines`, with its line count."""
    counts = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in paths}
    return {name: n for name, n in counts.items() if n > max_lines}


@pytest.mark.parametrize("package", PRODUCT)
def test_no_module_is_over_the_bound(package: str) -> None:
    assert oversized(sorted((ROOT / package).rglob("*.py"))) == {}


def test_a_module_over_the_bound_is_named() -> None:
    this = Path(__file__)  # this file, against a bound it exceeds
    lines = len(this.read_text().splitlines())
    assert oversized([this], max_lines=10) == {"tests/test_module_size.py": lines}
    assert oversized([this], max_lines=lines) == {}
