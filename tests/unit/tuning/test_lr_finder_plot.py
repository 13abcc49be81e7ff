"""The LR range test's plot: a real PNG, with or without a suggestion, diverging tail included."""

import math

from trainkit.tuning.lr_finder import LRFinderResult
from trainkit.tuning.lr_finder_plot import plot_lr_finder


def curve() -> LRFinderResult:
    lrs = [1e-4 * 10 ** (5 * i / 59) for i in range(60)]
    losses = [1.0 / (1 + math.exp(4 * (math.log10(lr) + 1.5))) + 0.05 for lr in lrs[:50]]
    losses += [losses[-1] * 3**k for k in range(1, 10)] + [math.inf]  # the divergence
    return LRFinderResult(
        lrs=lrs, losses=losses, raw_losses=[v * 1.05 for v in losses], suggestion=lrs[22], stopped_early=True
    )


def test_plot_is_written_as_a_png(tmp_path):
    result = curve()
    path = plot_lr_finder(result, tmp_path / "plots" / "lr_finder.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    result.suggestion = None  # no suggestion: still plots
    assert plot_lr_finder(result, tmp_path / "none.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
