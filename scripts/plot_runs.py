"""Compare runs: learning curves of every run below PATH in one PNG, and a Markdown table ranked
by the optimized metric.

    python scripts/plot_runs.py outputs/multiruns/<time>                 # a sweep: every job
    python scripts/plot_runs.py outputs/runs/<time> --out run.png        # a single run
    python scripts/plot_runs.py outputs/multiruns/<time> --metric test/acc
    python scripts/plot_runs.py outputs/runs/<a> outputs/runs/<b> --out ab.png   # compare runs
    python scripts/plot_runs.py 'outputs/runs/2026-12-01_*'                      # a glob (quoted or not)

Each PATH is a run directory or any directory above run directories (a run directory is one with a
metrics.jsonl); symlinked directories are followed. The table is sorted by summary.json's
`optimized_value` (or by `--metric`), best first as the task that made the runs says (summary.json's
`higher_is_better`: accuracy and mIoU higher, a loss and bits per byte lower); runs without a summary.json
(failed or still running) come last. Runs whose summary.json predates that record are ranked as every metric
but a loss is by default, higher first, with a warning. `wall s` is summary.json's wall_seconds:
a resumed run's counts every part (each checkpoint carries the time of the parts before it).
"""

import argparse
import glob
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

CURVES = ("train/loss", "val/loss", "val/acc")
MAX_LEGEND = 12  # a legend with more lines hides the curves


@dataclass
class Run:
    path: Path
    name: str  # relative to PATH
    epochs: dict = field(default_factory=dict)  # metric -> {epoch: value}
    summary: dict | None = None
    overrides: list = field(default_factory=list)


def higher_is_better(runs: list, metric: str) -> bool:
    """Whether a larger `metric` ranks first, as summary.json's `higher_is_better` records the task's direction
    (by the metric's own name: val/miou -> miou); no run recording it: a warning, and the default of every task."""
    name = metric.rsplit("/", 1)[-1]
    for run in runs:
        recorded = (run.summary or {}).get("higher_is_better") or {}
        if name in recorded:
            return bool(recorded[name])
    print(
        f"warning: no summary.json here records whether a higher {metric} is better (runs from before it was "
        f"recorded): ranked {'lower' if name == 'loss' else 'higher'} first, as every metric but a loss is by default; "
        f'if that is wrong, add "higher_is_better": {{"{name}": {str(name == "loss").lower()}}} to their summary.json',
        file=sys.stderr,
    )
    return name != "loss"


def find_runs(root: Path) -> list:
    """Every directory at or below `root` holding a metrics.jsonl, in path order (job 10 after 9);
    symlinked directories are followed (a run linked into a comparison folder), each real one once."""
    found, seen = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen or ".submitit" in Path(folder).parts:
            subfolders.clear()  # a link back up the tree, or a directory reached twice
            continue
        seen.add(real)
        if "metrics.jsonl" in files:
            found.append(Path(folder))

    def natural(path: Path):
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.relative_to(root).parts]

    return sorted(set(found), key=natural)


def read_metrics(path: Path) -> dict:
    """Per-epoch values from metrics.jsonl: {metric: {epoch: value}}. Later lines win (a resumed
    run may repeat an epoch); unreadable lines (a run killed mid-write) are skipped."""
    epochs: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "epoch" not in row or "train/step_loss" in row:
            continue  # step-level rows; the curves are per epoch
        for key, value in row.items():
            if key not in ("epoch", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                epochs.setdefault(key, {})[row["epoch"]] = value
    return epochs


def expand(paths: list) -> list:
    """The PATH arguments, each glob pattern (one the shell left unexpanded, e.g. quoted) expanded."""
    expanded = []
    for path in paths:
        matches = sorted(glob.glob(str(path))) if glob.has_magic(str(path)) else []
        expanded += [Path(match) for match in matches] or [path]
    return expanded


def load_run(path: Path, root: Path, prefix: str = "") -> Run:
    name = prefix + str(path.relative_to(root)) if path != root else path.name
    run = Run(path=path, name=name, epochs=read_metrics(path / "metrics.jsonl"))
    if (path / "summary.json").exists():
        run.summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    overrides = path / ".hydra" / "overrides.yaml"
    if overrides.exists():
        from omegaconf import OmegaConf

        run.overrides = [str(o) for o in OmegaConf.load(overrides)]
    return run


def metric_value(run: Run, metric: str | None) -> float | None:
    """The value a run is ranked by: `optimized_value` when `metric` is None or is the run's
    optimized metric, else the metric from the summary (test/* from `test`, else `best`)."""
    summary = run.summary
    if summary is None:
        return None
    if metric is None or metric == summary.get("optimized_metric"):
        value = summary.get("optimized_value")
    else:
        section = summary.get("test", {}) if metric.startswith("test/") else summary.get("best", {})
        value = section.get(metric, summary.get("final", {}).get(metric))
    return value if isinstance(value, (int, float)) and not math.isnan(value) else None


def rank(runs: list, metric: str | None) -> list:
    """Best first; runs without a value last, in their original order."""
    name = metric or next((r.summary["optimized_metric"] for r in runs if r.summary), "val/acc")
    scored = [r for r in runs if metric_value(r, metric) is not None]
    unscored = [r for r in runs if metric_value(r, metric) is None]
    if not scored:
        return unscored
    sign = -1 if higher_is_better(scored, name) else 1
    return sorted(scored, key=lambda r: sign * metric_value(r, metric)) + unscored


def short_override(override: str) -> str:
    """`optimizer.lr=0.007247031607588867` -> `optimizer.lr=0.007247`: Optuna's floats, readable."""
    key, sep, value = override.partition("=")
    try:
        number = float(value)
    except ValueError:
        return override
    if not sep or ("." not in value and "e" not in value.lower()) or math.isnan(number):
        return override  # integers and non-numbers as written
    return f"{key}={number:.4g}"


def split_overrides(runs: list) -> tuple:
    """(overrides every run shares, {run name: its own overrides}) so the table shows what differs;
    a single run keeps all of its overrides."""
    if len(runs) < 2:
        return [], {r.name: [short_override(o) for o in r.overrides] for r in runs}
    common = set.intersection(*(set(r.overrides) for r in runs))
    shared = [short_override(o) for o in runs[0].overrides if o in common]
    return shared, {r.name: [short_override(o) for o in r.overrides if o not in common] for r in runs}


def _number(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value)


def markdown_table(runs: list, metric: str | None) -> str:
    name = metric or next((r.summary["optimized_metric"] for r in runs if r.summary), "optimized")
    shared, own = split_overrides(runs)
    lines = []
    if shared:
        lines += [f"All runs: `{' '.join(shared)}`", ""]
    with_test = name != "test/acc"
    lines += [
        f"| rank | run | {name} |{' test/acc |' if with_test else ''} epochs | wall s | overrides |",
        f"|---:|---|---:|{'---:|' if with_test else ''}---:|---:|---|",
    ]
    for i, run in enumerate(runs, 1):
        summary = run.summary or {}
        value = metric_value(run, metric)
        status = "" if run.summary else " (no summary.json: failed or running)"
        overrides = f"`{' '.join(own[run.name])}`" if own[run.name] else "-"
        test = f" {_number(summary.get('test', {}).get('test/acc'))} |" if with_test else ""
        lines.append(
            f"| {i if value is not None else '-'} | {run.name}{status} | {_number(value)} |{test} "
            f"{summary.get('epochs', '-')} | {_number(summary.get('wall_seconds'), 1) if summary else '-'} | "
            f"{overrides} |"
        )
    return "\n".join(lines)


def _label(run: Run, own: dict) -> str:
    differs = " ".join(own.get(run.name) or [])
    text = f"{run.name}: {differs}" if differs else run.name
    return text if len(text) <= 90 else text[:87] + "..."


def plot(runs: list, out: Path, metric: str | None) -> None:
    """Draw the curves (see draw) and save them as a PNG at `out`."""
    import matplotlib.pyplot as plt

    figure = draw(runs, metric)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)


def draw(runs: list, metric: str | None):
    """One panel per curve, one line per run (the same color in every panel), a marker on every
    epoch; the x-axis covers whole epochs, so a 1-epoch run is a visible point at its epoch, not a
    dot on an axis a tenth of an epoch wide."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    curves = list(CURVES)
    if metric and metric not in curves and any(metric in r.epochs for r in runs):
        curves.append(metric)
    _, own = split_overrides(runs)
    figure, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4.5), squeeze=False, layout="constrained")
    epochs = sorted({epoch for run in runs for curve in curves for epoch in run.epochs.get(curve, {})})
    for ax, curve in zip(axes[0], curves):
        for color, run in enumerate(runs):
            points = sorted(run.epochs.get(curve, {}).items())
            if points:  # the same color for a run in every panel
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker="o",
                    markersize=3 if len(points) > 1 else 6,  # a lone point must show without a line
                    color=f"C{color % 10}",
                    label=_label(run, own),
                )
        ax.set_title(curve)
        ax.set_xlabel("epoch")
        if epochs:  # half an epoch of room on each side; at least one epoch wide
            ax.set_xlim(epochs[0] - 0.5, epochs[-1] + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles and len(runs) <= MAX_LEGEND:
        figure.legend(
            handles.values(),
            handles.keys(),
            loc="outside lower center",
            ncol=min(2, len(handles)),
            fontsize="small",
            frameon=False,
        )
    return figure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", type=Path, nargs="+", metavar="PATH", help="run directories, directories above runs, or globs"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG to write (default: PATH/runs.png; with several: ./runs.png)"
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="rank by this metric (val/acc, val/loss, test/acc, ...); default: each run's optimized_metric",
    )
    args = parser.parse_args(argv)
    paths = expand(args.paths)
    for path in paths:
        if not path.is_dir():
            parser.error(
                f"{path}: no such directory"
                + (" (the pattern matched nothing)" if path in args.paths and glob.has_magic(str(path)) else "")
            )
    several = len(paths) > 1  # names then start with their PATH's own name: two runs' "." differ
    runs = [load_run(run, path, f"{path.name}/" if several else "") for path in paths for run in find_runs(path)]
    if not runs:
        where = " ".join(str(path) for path in paths)
        print(f"error: no run directory (with a metrics.jsonl) at or below {where}", file=sys.stderr)
        return 1
    runs = rank(runs, args.metric)
    out = args.out or (Path("runs.png") if several else paths[0] / "runs.png")
    plot(runs, out, args.metric)
    print(markdown_table(runs, args.metric))
    print(f"\n{len(runs)} run(s); curves in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
