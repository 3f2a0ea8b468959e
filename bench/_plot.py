"""matplotlib for the benchmarks: no screen (Agg), and one way to save a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported only when plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` as PNG, and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
