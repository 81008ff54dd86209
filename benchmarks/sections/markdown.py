"""Number and table formatting shared by the sections, and reading benchmark JSON.

Pure functions: every section renders its markdown from data with these, so a number is
written the same way in every table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def num(value: float | None, digits: int = 1) -> str:
    """`1.5`, `12,345`; `n/a` for a missing or NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def span(seconds: float) -> str:
    """`3 h`, `1.5 h`, `20 min`: a simulated span for prose."""
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, without a trailing newline."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pick(row: Mapping[str, Any], *names: str) -> float | None:
    """The first of the dotted paths (`cpu.median_ms`) that holds a number in a benchmark's
    JSON row; None where none does (a benchmark that did not measure it)."""
    for name in names:
        value: Any = row
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int | float):
            return float(value)
    return None
