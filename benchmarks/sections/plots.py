"""matplotlib for the sections' figures: the Agg backend (no display), and saving one figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

# Before pyplot is imported: the figures are drawn on machines without a display.
matplotlib.use("Agg")

import matplotlib.pyplot as plt

__all__ = ["plt", "save"]


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
