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


def saved_figures(monkeypatch) -> list:
    """Every matplotlib Figure saved from now on, kept for the test to read what was drawn."""
    from matplotlib.figure import Figure

    figures, savefig = [], Figure.savefig

    def save(figure, *args, **kwargs):
        figures.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", save)
    return figures


def test_the_png_shows_both_curves_against_a_log_lr_axis_and_marks_the_suggestion(tmp_path, monkeypatch):
    figures, result = saved_figures(monkeypatch), curve()
    path = plot_lr_finder(result, tmp_path / "plots" / "lr_finder.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (axes,) = figures[0].axes
    raw, smoothed, marker = axes.get_lines()[:2] + axes.get_lines()[-1:]
    assert list(raw.get_xdata()) == result.lrs and list(raw.get_ydata()) == result.raw_losses
    assert list(smoothed.get_xdata()) == result.lrs and list(smoothed.get_ydata()) == result.losses
    assert list(marker.get_xdata()) == [result.suggestion] and list(marker.get_ydata()) == [result.losses[22]]
    assert axes.get_xscale() == "log" and "diverged" in axes.get_title()
    result.suggestion = None  # no suggestion: both curves, no marker
    plot_lr_finder(result, tmp_path / "none.png")
    assert len(figures[1].axes[0].get_lines()) == 2
