"""The LR range test's picture: loss against learning rate, the suggestion marked.

plot_lr_finder(result, run_dir / "lr_finder.png")   # result: what trainkit.tuning.lr_finder.lr_range_test returns
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol


class Curve(Protocol):
    """What the plot reads of trainkit.tuning.lr_finder's LRFinderResult (that module imports this one)."""

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    suggestion: float | None
    stopped_early: bool


def plot_lr_finder(result: Curve, path: str | Path) -> Path:
    """Save loss against LR (log x axis) as a PNG from an LRFinderResult (lrs, losses, raw_losses, suggestion,
    stopped_early): raw losses faint, smoothed loss solid, the suggestion marked. matplotlib is imported here (it is
    slow to import), without pyplot, so no display or global backend is involved."""
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(7, 4.5), dpi=100)
    axes = figure.subplots()
    axes.plot(result.lrs, result.raw_losses, color="tab:blue", alpha=0.25, linewidth=1, label="loss")
    axes.plot(result.lrs, result.losses, color="tab:blue", linewidth=2, label="smoothed loss")
    finite = [v for v in result.losses if math.isfinite(v)]
    if finite:  # from the lowest loss to a little above the start: the diverging tail would squash the rest
        low, start = min(finite + [v for v in result.raw_losses if math.isfinite(v)]), finite[0]
        span = max(start - low, 0.1 * abs(start), 1e-8)
        axes.set_ylim(low - 0.05 * span, start + 0.3 * span)
    if result.suggestion:
        index = result.lrs.index(result.suggestion)
        axes.axvline(result.suggestion, color="tab:red", linestyle="--", linewidth=1)
        axes.plot(
            [result.suggestion],
            [result.losses[index]],
            "o",
            color="tab:red",
            label=f"suggestion {result.suggestion:.2e}",
        )
    axes.set_xscale("log")
    axes.set_xlabel("learning rate (base)")
    axes.set_ylabel("training loss")
    axes.set_title("LR range test" + (" (stopped: loss diverged)" if result.stopped_early else ""))
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
