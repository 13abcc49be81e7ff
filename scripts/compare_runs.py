"""Compare runs: seeds (and folds) of one setting averaged, with a 95% confidence interval, the settings ranked;
a PNG per metric of each setting's mean curve; or two runs diffed.

    python scripts/compare_runs.py outputs/multiruns/<time>                  # a sweep: each setting, seeds averaged
    python scripts/compare_runs.py outputs/multiruns/<time> --format latex   # the table for a paper (or csv)
    python scripts/compare_runs.py outputs/multiruns/<time> --metric test/acc --over seed
    python scripts/compare_runs.py outputs/multiruns/<time> --pool-code      # runs of other code as one setting
    python scripts/compare_runs.py outputs/runs/<a> outputs/runs/<b> --out ab/   # several paths, a glob (quoted or not)
    python scripts/compare_runs.py --diff outputs/runs/<a> outputs/runs/<b>  # config, code, packages, machine, data

Each PATH is a run directory or any directory above run directories (a run directory is one with a metrics.jsonl
or Hydra's .hydra/); symlinked directories are followed. Runs whose configs as set (.hydra/config.yaml, resolved)
differ only in the `--over` keys (default `seed,data.fold`; a run without data.fold has none) form a group: one
setting, n runs. Keys that say how a run is watched or resumed, not what it trains (NOT_SETTINGS), do not split
groups, nor does what a run filled in itself (.hydra/filled_in.yaml: optimized_metric, the data's class count,
model.num_labels, a searched batch size), listed apart as "filled in by the runs"; runs recorded before that file
are read through KNOWN_FILLED_IN. Runs of other code (provenance.json's commit, code.diff) are settings apart unless
`--pool-code`; a run continued across commits is mixed code, a run without provenance unknown code, and a seed that
repeats within a setting is named. For each summary metric (test/*, the best epoch's val/*, wall seconds) a group
has its mean, sample standard deviation and 95% confidence interval, mean +- t(0.975, n-1) * std / sqrt(n); the
folds of a k-fold setting use the corrected resampled t (Nadeau and Bengio 2003), std * sqrt(1/n + n_val/n_train)
with the split sizes the runs recorded (else 1/(k-1)); the interval column says which. An interval is clipped to
its metric's range where summary.json records the task's (`metric_ranges`; wall seconds >= 0), marked and
footnoted. A group of one says n=1 and has no interval. Groups are ranked by the runs' optimized_metric (or
`--metric`, refused in one line where no finished run has it) in the direction the task recorded in summary.json
(`higher_is_better`); the best is marked. A group that shares its seeds (or folds) with the best gets the paired
difference (its mean and interval) and is judged by it: "not separable" where the interval holds 0; any other is
"not separable" where its interval overlaps the best's (the test is conservative: disjoint intervals are a
difference, overlapping ones may still be one). Every run named or found is averaged or listed under "not averaged"
with why: failed before its first epoch (no metrics.jsonl), unfinished (no summary.json), diverged (a non-finite
loss). Runs of different tasks or data are refused: the data each read before any split, as summary.json's `data`
records it (its files and their contents, its samples, its classes; a fold, a split seed or a tokenizer is a
setting), or, for runs from before it was recorded, the config's data keys (IDENTITY). `wall s` is summary.json's
wall_seconds: every part of a resumed run. The PNGs go to `--out`, by default PATH/compare, with several PATHs
./compare; the notes give the absolute path written.
"""

import argparse
import csv
import glob
import hashlib
import io
import json
import math
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

OVER = "seed,data.fold"  # what varies between the runs of one setting
# Keys that say how a run is watched, stopped or resumed, not what it trains: runs differing in them are one setting.
NOT_SETTINGS = ("resume", "print_config", "sweep", "logger", "trainer.progress_bar")
IDENTITY = ("task._target_", "data._target_", "data.name", "data.root")  # runs that differ here are not comparable
FAILED_STOPS = ("non-finite loss",)  # summary.json's stop_reason of a run that diverged
WALL = "wall_seconds"
WALL_RANGE = (0, None)  # seconds are never negative, whatever the task
MAX_LEGEND = 12  # a legend with more lines hides the curves
FILLED_IN = ".hydra/filled_in.yaml"  # what a run filled in itself, apart from .hydra/config.yaml (what was set)
# The keys a run fills in where they are left to it (trainkit.config.filled_in): a run recorded before
# .hydra/filled_in.yaml is read through them, each a setting only where its own overrides set it.
KNOWN_FILLED_IN = (
    "optimized_metric",
    "regularization.early_stopping.monitor",
    "regularization.early_stopping.mode",
    "data.vocabulary",
    "data.pad_id",
    "data.num_classes",
    "trainer.micro_batch_size",
    "task.num_classes",
    "model.num_classes",
    "model.num_labels",
    "model.vocabulary",
    "model.vocab_size",
    "model.pad_id",
    "model.pad_token_id",
)
CLIPPED = "†"  # marks an interval clipped to its metric's range


@dataclass
class Run:
    path: Path
    name: str  # relative to PATH
    epochs: dict = field(default_factory=dict)  # metric -> {epoch: value}
    summary: dict | None = None
    overrides: list = field(default_factory=list)
    config: dict = field(default_factory=dict)  # what was set, resolved and flat: {"optimizer.lr": 0.1, ...}
    filled: dict = field(default_factory=dict)  # what the run filled in itself (never a setting), flat
    unknown: set = field(default_factory=set)  # keys an older run cannot say were set or filled in: not compared
    code: str | None = None  # the code version it ran (commit, uncommitted changes); None: unknown


@dataclass
class Stats:
    """Mean, sample standard deviation and the 95% interval of `values`: Student t, or with `ratio` (the val split's
    size over the training split's, folds) the corrected resampled t of Nadeau and Bengio (2003), whose variance is
    std^2 * (1/n + ratio): folds share most of their training data, so their results are not independent. The
    interval is clipped to `bounds`, the metric's range ((low, high), None: no limit)."""

    values: list
    bounds: tuple = (None, None)
    ratio: float | None = None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / self.n

    @property
    def std(self) -> float | None:
        if self.n < 2:
            return None
        return math.sqrt(sum((value - self.mean) ** 2 for value in self.values) / (self.n - 1))

    @property
    def half_width(self) -> float | None:
        if self.std is None:
            return None
        return t_quantile(self.n - 1) * self.std * math.sqrt(1 / self.n + (self.ratio or 0))

    @property
    def unclipped(self) -> tuple[float, float] | None:
        half = self.half_width
        return None if half is None else (self.mean - half, self.mean + half)

    @property
    def interval(self) -> tuple[float, float] | None:
        """The interval within the metric's range."""
        if self.unclipped is None:
            return None
        (low, high), (least, most) = self.unclipped, self.bounds
        return (low if least is None else max(low, float(least)), high if most is None else min(high, float(most)))

    @property
    def clipped(self) -> bool:
        return self.interval != self.unclipped


@cache
def t_quantile(degrees_of_freedom: int) -> float:
    """t(0.975, dof): the two-sided 95% quantile of Student's t distribution."""
    from scipy.stats import t

    return float(t.ppf(0.975, degrees_of_freedom))


@dataclass
class Group:
    settings: dict  # the keys that set this group apart from the others
    runs: list
    ratio: float | None = None  # folds: the corrected resampled t's n_val / n_train (fold_ratio)
    interval_kind: str = "t"  # which interval its rows use, as the table says it

    def stats(self, metric: str) -> Stats:
        values = [value for run in self.runs if (value := metric_value(run, metric)) is not None]
        return Stats(values, metric_range(self.runs, metric), self.ratio)


def metric_range(runs: list, metric: str) -> tuple:
    """(low, high) a metric lies in, as summary.json's `metric_ranges` records its task's (by the metric's name:
    val/acc -> acc); wall seconds >= 0; (None, None) where no run records one."""
    if metric == WALL:
        return WALL_RANGE
    name = metric.rsplit("/", 1)[-1]
    for run in runs:
        recorded = (run.summary or {}).get("metric_ranges") or {}
        if name in recorded:
            return tuple(recorded[name])
    return (None, None)


def fold_ratio(runs: list) -> tuple[float | None, str]:
    """For runs that are folds of one k-fold split (data.fold differs): the corrected resampled t's n_val / n_train,
    from the split sizes each run recorded (summary.json's split_sizes), else 1/(k-1) for data.folds=k; and which
    interval that is. Other runs: (None, "t")."""
    folds = {run.config.get("data.fold") for run in runs}
    k = next((run.config.get("data.folds") for run in runs if run.config.get("data.folds")), None)
    if len(runs) < 2 or len(folds) < 2 or None in folds or not k:
        return None, "t"
    sizes = [(run.summary or {}).get("split_sizes") or {} for run in runs]
    if all(size.get("train") and size.get("val") for size in sizes):
        ratio = sum(size["val"] / size["train"] for size in sizes) / len(sizes)
        return ratio, f"corrected t (folds; n_val/n_train {ratio:.3f}, recorded)"
    return 1 / (k - 1), f"corrected t (folds; 1/(k-1) for k={k}: split sizes not recorded)"


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
    """Every run directory at or below `root` (one holding a metrics.jsonl, or Hydra's .hydra/ record: a run that
    failed before its first epoch is one too), in path order (job 10 after 9); symlinked directories are followed
    (a run linked into a comparison folder), each real one once."""
    found, seen = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen or ".submitit" in Path(folder).parts:
            subfolders.clear()  # a link back up the tree, or a directory reached twice
            continue
        seen.add(real)
        if "metrics.jsonl" in files or (".hydra" in subfolders and not evaluated_only(Path(folder))):
            found.append(Path(folder))

    def natural(path: Path):
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.relative_to(root).parts]

    return sorted(set(found), key=natural)


def evaluated_only(folder: Path) -> bool:
    """Whether `folder`'s .hydra/ is the record of an eval.py job (hydra.job.name), not of a run."""
    from omegaconf import OmegaConf

    hydra = folder / ".hydra" / "hydra.yaml"
    return hydra.is_file() and OmegaConf.select(OmegaConf.load(hydra), "hydra.job.name") == "eval"


def read_metrics(path: Path) -> dict:
    """Per-epoch values from metrics.jsonl: {metric: {epoch: value}}. Later lines win (a resumed
    run may repeat an epoch); unreadable lines (a run killed mid-write) are skipped; no file: {}."""
    epochs: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
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


def read_config(path: Path) -> dict:
    """The run's config as set (.hydra/config.yaml: as composed, and as a resume rewrites it), resolved and flat
    ({"optimizer.lr": 0.1}); a run without one: its overrides (.hydra/overrides.yaml) as {key: value}; neither: {}."""
    from omegaconf import OmegaConf

    saved = path / ".hydra" / "config.yaml"
    if saved.is_file():
        config = OmegaConf.load(saved)
        try:
            plain = OmegaConf.to_container(config, resolve=True)
        except Exception:  # an interpolation this process cannot resolve (a resolver of yours): compare as written
            plain = OmegaConf.to_container(config, resolve=False)
        return flatten(plain)
    overrides = path / ".hydra" / "overrides.yaml"
    pairs = [str(o).partition("=") for o in OmegaConf.load(overrides)] if overrides.is_file() else []
    return {key.lstrip("+~"): value for key, _, value in pairs}


def flatten(tree: object, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict = {}
    for key, value in tree.items():  # an empty section ({}) is a value of its own
        flat.update(flatten(value, f"{prefix}{key}.") if value and isinstance(value, dict) else {prefix + key: value})
    return flat


def expand(paths: list) -> list:
    """The PATH arguments, each glob pattern (one the shell left unexpanded, e.g. quoted) expanded."""
    expanded = []
    for path in paths:
        matches = sorted(glob.glob(str(path))) if glob.has_magic(str(path)) else []
        expanded += [Path(match) for match in matches] or [path]
    return expanded


def load_run(path: Path, root: Path, prefix: str = "") -> Run:
    name = prefix + str(path.relative_to(root)) if path != root else path.name
    run = Run(path=path, name=name, epochs=read_metrics(path / "metrics.jsonl"), config=read_config(path))
    if (path / "summary.json").exists():
        run.summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    overrides = path / ".hydra" / "overrides.yaml"
    from omegaconf import OmegaConf

    if overrides.exists():
        run.overrides = [str(o) for o in OmegaConf.load(overrides)]
    if (path / FILLED_IN).is_file():
        run.filled = flatten(OmegaConf.to_container(OmegaConf.load(path / FILLED_IN)) or {})
    elif (path / ".hydra" / "config.yaml").is_file():  # recorded before filled_in.yaml: set, or filled in?
        set_here = {override.partition("=")[0].lstrip("+~") for override in run.overrides}
        run.unknown = {key for key in KNOWN_FILLED_IN if key in run.config and key not in set_here}
    versions = code_versions(path)
    run.code = None if None in versions else ", then ".join(dict.fromkeys(versions))
    return run


def code_versions(run: Path) -> list:
    """The code each part of a run ran, first part first (provenance_parts/<n>/, then the run's own record): its
    commit, and a digest of code.diff where it had uncommitted changes; None for a part whose provenance.json is
    missing or records no commit."""
    parts = sorted((p for p in (run / "provenance_parts").glob("*") if p.name.isdigit()), key=lambda p: int(p.name))
    versions = []
    for part in [*parts, run]:
        commit = ((read_json(part / "provenance.json") or {}).get("git") or {}).get("commit")
        diff = part / "code.diff"
        changes = f"+diff {hashlib.sha256(diff.read_bytes()).hexdigest()[:7]}" if diff.is_file() else ""
        versions.append(commit[:7] + changes if commit else None)
    return versions


def not_finished(run: Run) -> str | None:
    """Why `run` is left out of the averages (failed before its first epoch, unfinished, diverged), or None for a
    finished run."""
    if not (run.path / "metrics.jsonl").is_file():
        return "failed before its first epoch (or is still starting): no metrics.jsonl"
    if run.summary is None:
        return "unfinished (stopped, failed or still running): no summary.json"
    if run.summary.get("stop_reason") in FAILED_STOPS:
        return f"diverged: summary.json's stop_reason is {run.summary['stop_reason']}"
    return None


def metric_value(run: Run, metric: str) -> float | None:
    """A finished run's `metric`: the optimized metric's `optimized_value`, test/* from `test`, wall_seconds,
    else the best epoch's (`best`, then `final`); None where it has none or it is not finite."""
    summary = run.summary or {}
    if metric == summary.get("optimized_metric"):
        value = summary.get("optimized_value")
    elif metric == WALL:
        value = summary.get(WALL)
    else:
        section = summary.get("test", {}) if metric.startswith("test/") else summary.get("best", {})
        value = section.get(metric, summary.get("final", {}).get(metric))
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if finite else None


def summary_metrics(runs: list, first: str) -> list:
    """The metrics a table reports: `first` (the one ranked by), each test/*, the best epoch's val/*, wall seconds."""
    names = {first: None}
    for run in runs:
        summary = run.summary or {}
        names.update(dict.fromkeys(summary.get("test", {})))
    for run in runs:
        names.update(dict.fromkeys(key for key in (run.summary or {}).get("best", {}) if key.startswith("val/")))
    return [*names, WALL]


def is_over(key: str, over: tuple) -> bool:
    return any(key == name or key.startswith(name + ".") for name in over)


def refuse_mixed(runs: list) -> str | None:
    """One line naming two runs of different tasks or data, or None when all are alike. The data is what each run
    read before any split, as summary.json's `data` records it (trainkit.data.fingerprint.data_identity: its files and
    their contents, its samples, its classes; not the fold, the split seed or a tokenizer, which are settings), where
    both runs record it; else (a run from before it was recorded) the config's data keys in IDENTITY."""
    known = [run for run in runs if "task._target_" in run.config]  # a Hydra config, not bare overrides
    first = known[0] if known else None
    for run in known[1:]:
        differ = [key for key in IDENTITY if first.config.get(key) != run.config.get(key)]
        data = [recorded_data(first), recorded_data(run)]
        changes = []
        if None not in data:  # what they read decides, not where from (a copy of the data elsewhere is the same)
            from trainkit.data.fingerprint import identity_changes

            differ = [key for key in differ if not key.startswith("data.")]
            changes = identity_changes(data[0], data[1])
        parts = [f"{k}={first.config.get(k)} vs {run.config.get(k)}" for k in differ]
        if changes:
            parts.append(f"{run.name}'s data against {first.name}'s: {'; '.join(changes)}")
        if parts:
            return (
                f"{first.name} and {run.name} are runs of different tasks or data ({', '.join(parts)}): their "
                f"metrics do not compare; give compare_runs.py the runs of one task and data"
            )
    return None


def recorded_data(run: Run) -> dict | None:
    """What `run` read before any split, as its summary.json records it (`data`); None where it records none."""
    data = (run.summary or {}).get("data")
    return data if isinstance(data, dict) and data else None


def settings_of(run: Run, over: tuple, unknown: set) -> dict:
    """What was set for `run` that may set it apart: its config less the `over` keys, NOT_SETTINGS and `unknown`
    (keys an older run cannot say were set)."""
    return {
        key: value
        for key, value in run.config.items()
        if not is_over(key, over) and not is_over(key, NOT_SETTINGS) and key not in unknown
    }


def group_runs(runs: list, over: tuple, pool_code: bool = False) -> list:
    """Runs that differ only in the `over` keys (and NOT_SETTINGS, and what each run filled in), in the order their
    first run comes; runs of other code (commit, uncommitted changes) apart unless `pool_code`."""
    unknown = set().union(*(run.unknown for run in runs))
    grouped: dict = {}
    for run in runs:
        setting = settings_of(run, over, unknown) | ({} if pool_code else {"code": run.code or "unknown"})
        grouped.setdefault(json.dumps(setting, sort_keys=True, default=str), (setting, []))[1].append(run)
    settings = [setting for setting, _ in grouped.values()]
    keys = dict.fromkeys(key for setting in settings for key in setting)
    differing = [key for key in keys if len({_text(setting.get(key)) for setting in settings}) > 1]
    groups = [Group({k: setting.get(k) for k in differing}, members) for setting, members in grouped.values()]
    for group in groups:
        group.ratio, group.interval_kind = fold_ratio(group.runs)
    return groups


def rank(groups: list, metric: str, higher: bool) -> list:
    """Best mean first; groups without a value last, in their order."""
    scored = [g for g in groups if g.stats(metric).n]
    sign = -1 if higher else 1
    return sorted(scored, key=lambda g: sign * g.stats(metric).mean) + [g for g in groups if not g.stats(metric).n]


def over_values(run: Run, over: tuple) -> str:
    """The run's `over` keys and values (its seed, its fold): what pairs it with a run of another setting."""
    return " ".join(f"{key}={_text(value)}" for key, value in sorted(run.config.items()) if is_over(key, over))


def paired(best: Group, group: Group, metric: str, over: tuple) -> Stats | None:
    """`group`'s values less the best's, run by run where both settings have a run of the same seed (and fold):
    the paired difference, with the best's interval kind (folds: corrected); None where fewer than two runs pair, or
    a seed repeats within a setting (which of its runs would pair is not defined)."""
    values = []
    for members in (best.runs, group.runs):
        keyed = {over_values(run, over): metric_value(run, metric) for run in members}
        if len(keyed) < len(members):
            return None
        values.append({key: value for key, value in keyed.items() if value is not None})
    shared = [key for key in values[0] if key in values[1]]
    if len(shared) < 2:
        return None
    return Stats([values[1][key] - values[0][key] for key in shared], ratio=best.ratio)


def verdicts(ranked: list, metric: str, over: tuple, higher: bool) -> tuple[list, list]:
    """Each group against the first (the best): best, not separable, worse (or better, where the runs it pairs with
    the best's say so), or no interval (its own or the best's); and the paired difference where the runs pair (or
    None). Paired runs are judged by their difference's interval (does it hold 0?); others by whether their
    intervals overlap."""
    best = ranked[0].stats(metric).interval if ranked else None
    marks, pairs = [], []
    for i, group in enumerate(ranked):
        own = group.stats(metric)
        pair = paired(ranked[0], group, metric, over) if i else None
        pairs.append(pair)
        if i == 0:
            marks.append("best")
        elif not own.n:
            marks.append("-")
        elif pair is not None and pair.interval is not None:
            low, high = pair.interval
            marks.append("not separable" if low <= 0 <= high else "worse" if (low > 0) != higher else "better")
        elif own.interval is None:
            marks.append("no interval (n=1)")
        elif best is None:
            marks.append("the best has no interval (n=1)")
        else:
            low, high = own.interval
            marks.append("not separable" if low <= best[1] and best[0] <= high else "worse")
    return marks, pairs


def _text(value) -> str:
    """A config value as an override writes it (null, true, lists as JSON); Optuna's long floats shortened."""
    if isinstance(value, float) and math.isfinite(value) and value != int(value):
        return f"{value:.4g}"
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def setting_label(group: Group) -> str:
    return " ".join(f"{key}={_text(value)}" for key, value in group.settings.items()) or "(all runs)"


def shared_overrides(runs: list, over: tuple) -> list:
    """The overrides every run shares, less the `over` keys: what the whole table was run with."""
    if not runs:
        return []
    common = set.intersection(*(set(run.overrides) for run in runs))
    return [o for o in runs[0].overrides if o in common and not is_over(o.partition("=")[0].lstrip("+~"), over)]


def _number(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if 0 < abs(value) < 1e-3 or abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value)


def cell(stats: Stats, n: int, metric: str) -> str:
    """`mean ± std [low, high]`; a group of one: `value (n=1)`; values from fewer runs than the group's: `(n=k)`."""
    if not stats.n:
        return "-"
    digits = 1 if metric == WALL else 4
    if stats.interval is None:
        return f"{_number(stats.mean, digits)} (n=1)"
    fewer = f" (n={stats.n})" if stats.n < n else ""
    return f"{_number(stats.mean, digits)} ± {_number(stats.std, digits)} {bounds(stats, digits)}{fewer}"


def bounds(stats: Stats, digits: int, mark: str = CLIPPED) -> str:
    """The interval as `[low, high]`, marked where it is clipped to the metric's range."""
    low, high = stats.interval or (None, None)
    return f"[{_number(low, digits)}, {_number(high, digits)}]" + (mark if stats.clipped else "")


def paired_cell(pair: Stats | None, metric: str) -> str:
    """The paired difference against the best: `signed mean [low, high] (n=k)`, or `-`."""
    if pair is None or pair.interval is None:
        return "-"
    digits = 1 if metric == WALL else 4
    signed = f"{'+' if pair.mean >= 0 else ''}{_number(pair.mean, digits)}"
    return f"{signed} {bounds(pair, digits)} (n={pair.n})"


def header(metric: str) -> str:
    return "wall s" if metric == WALL else metric


def interval_kind(group: Group) -> str:
    return group.interval_kind if len(group.runs) > 1 else "-"


def markdown_table(ranked: list, metrics: list, marks: list, pairs: list) -> str:
    lines = [
        f"| rank | setting | n | {' | '.join(header(m) for m in metrics)} | interval | paired vs best | vs best |",
        f"|---:|---|---:|{'---|' * len(metrics)}---|---|---|",
    ]
    for i, (group, mark, pair) in enumerate(zip(ranked, marks, pairs), 1):
        cells = " | ".join(cell(group.stats(m), len(group.runs), m) for m in metrics)
        best = f"**{mark}**" if mark == "best" else mark
        paired_text = paired_cell(pair, metrics[0])
        lines.append(
            f"| {i} | `{setting_label(group)}` | {len(group.runs)} | {cells} | {interval_kind(group)} | {paired_text} "
            f"| {best} |"
        )
    return "\n".join(lines)


def csv_table(ranked: list, metrics: list, marks: list, pairs: list) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = [f"{m}{part}" for m in metrics for part in ("", "_std", "_ci_low", "_ci_high")]
    paired_columns = ["paired_vs_best", "paired_ci_low", "paired_ci_high", "paired_n"]
    writer.writerow(["rank", "setting", "n", *columns, "interval", *paired_columns, "vs_best", "runs"])
    for i, (group, mark, pair) in enumerate(zip(ranked, marks, pairs), 1):
        values = []
        for metric in metrics:
            stats = group.stats(metric)
            interval = stats.interval or (None, None)
            values += [stats.mean if stats.n else None, stats.std, *interval]
        has_pair = pair is not None and pair.interval is not None
        difference = [pair.mean, *pair.interval, pair.n] if has_pair else [None] * 4
        runs = " ".join(r.name for r in group.runs)
        row = [i, setting_label(group), len(group.runs), *values, interval_kind(group), *difference, mark, runs]
        writer.writerow(["" if value is None else value for value in row])
    return out.getvalue().rstrip("\n")


def latex_escape(text: str) -> str:
    for char in "\\&%$#_{}":
        text = text.replace(char, "\\" + char if char != "\\" else r"\textbackslash{}")
    return text


def latex_cell(stats: Stats, metric: str) -> str:
    digits = 1 if metric == WALL else 4
    if not stats.n:
        return "--"
    if stats.interval is None:
        return f"${_number(stats.mean, digits)}$ ($n=1$)"
    clipped = bounds(stats, digits, mark="$^\\dagger$")
    return f"${_number(stats.mean, digits)} \\pm {_number(stats.std, digits)}$ {clipped}"


def latex_table(ranked: list, metrics: list, marks: list, pairs: list, caption: str) -> str:
    headers = ["Rank", "Setting", "$n$", *(latex_escape(header(m)) for m in metrics), "Interval", "Paired vs best"]
    lines = [
        f"% {caption}",
        f"\\begin{{tabular}}{{rlr{'l' * len(metrics)}lll}}",
        "\\hline",
        " & ".join([*headers, "vs best"]) + " \\\\",
        "\\hline",
    ]
    for i, (group, mark, pair) in enumerate(zip(ranked, marks, pairs), 1):
        cells = [latex_cell(group.stats(m), m) for m in metrics]
        best = f"\\textbf{{{mark}}}" if mark == "best" else mark
        extra = [latex_escape(interval_kind(group)), latex_escape(paired_cell(pair, metrics[0]))]
        row = [str(i), latex_escape(setting_label(group)), str(len(group.runs)), *cells, *extra, best]
        lines.append(" & ".join(row) + " \\\\")
    return "\n".join([*lines, "\\hline", "\\end{tabular}"])


def curve_metrics(groups: list, extra: str | None) -> list:
    """The per-epoch metrics drawn: train/loss, every val/* the runs logged, and `extra` if it has a curve."""
    logged = list(dict.fromkeys(metric for group in groups for run in group.runs for metric in run.epochs))
    curves = [m for m in logged if m == "train/loss"] + sorted((m for m in logged if m.startswith("val/")), key=len)
    if extra and extra in logged and extra not in curves:
        curves.append(extra)
    return curves


def mean_curve(group: Group, metric: str) -> list:
    """[(epoch, mean, min, max)] over the group's runs that reached each epoch."""
    by_epoch: dict = {}
    for run in group.runs:
        for epoch, value in run.epochs.get(metric, {}).items():
            if math.isfinite(value):
                by_epoch.setdefault(epoch, []).append(value)
    return [(epoch, sum(v) / len(v), min(v), max(v)) for epoch, v in sorted(by_epoch.items())]


def draw(groups: list, metric: str):
    """One line a group, its mean at each epoch with a marker, in a band from its runs' lowest to highest value;
    the x-axis covers whole epochs, so a 1-epoch run is a visible point at its epoch."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, ax = plt.subplots(figsize=(6.5, 4.5), layout="constrained")
    epochs = []
    for color, group in enumerate(groups):
        points = mean_curve(group, metric)
        if not points:
            continue
        x, mean, low, high = (list(column) for column in zip(*points))
        epochs += x
        label = f"{setting_label(group)} (n={len(group.runs)})"
        style = {"color": f"C{color % 10}", "marker": "o", "markersize": 3 if len(points) > 1 else 6}
        ax.plot(x, mean, label=label if len(label) <= 90 else label[:87] + "...", **style)
        ax.fill_between(x, low, high, color=f"C{color % 10}", alpha=0.2, linewidth=0)
    ax.set_title(f"{metric}: mean of each setting's runs, band from lowest to highest")
    ax.set_xlabel("epoch")
    if epochs:  # half an epoch of room on each side; at least one epoch wide
        ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0] and len(groups) <= MAX_LEGEND:
        ax.legend(fontsize="small", frameon=False)
    return figure


def plot(groups: list, out: Path, extra: str | None) -> list:
    """A PNG a curve metric in `out` (val/acc -> val_acc.png); returns their paths."""
    import matplotlib.pyplot as plt

    written = []
    for metric in curve_metrics(groups, extra):
        figure = draw(groups, metric)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{metric.replace('/', '_')}.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written


def compare(runs: list, over: tuple, metric: str | None, form: str, out: Path, pool_code: bool = False) -> int:
    """Print the table (stdout) and the notes (stdout for markdown, else stderr: a csv or latex table pipes
    into a file alone); write the curves. Every run is in the table or in a `not averaged` note."""
    refusal = refuse_mixed(runs)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    finished = [run for run in runs if not_finished(run) is None]
    apart = [run for run in runs if not_finished(run) is not None]
    notes = []
    if finished:
        optimized = finished[0].summary.get("optimized_metric") or "val/acc"
        if metric and all(metric_value(run, metric) is None for run in finished):
            have = ", ".join(summary_metrics(finished, optimized))
            print(f"error: --metric {metric}: no finished run here has it; theirs are {have}", file=sys.stderr)
            return 1
        name = metric or optimized
        higher = higher_is_better(finished, name)
        ranked = rank(group_runs(finished, over, pool_code), name, higher)
        metrics = summary_metrics(finished, name)
        marks, pairs = verdicts(ranked, name, over, higher)
        shared = shared_overrides(runs, over)
        caption = (
            f"Each setting's runs over {', '.join(over) or 'nothing'}: mean ± sample std [95% CI: Student t, n-1 "
            f"dof; folds: the corrected resampled t, as the interval column says]; ranked by {name}, "
            f"{'higher' if higher else 'lower'} is better; vs best: by the paired difference where runs share their "
            f"{', '.join(over) or 'keys'}, else intervals that overlap the best's are not separable from it"
        )
        caption += "; runs of other code pooled (--pool-code)" if pool_code else ""
        quote = "`" if form == "markdown" else ""
        caption += f"; all runs: {quote}{' '.join(shared)}{quote}" if shared else ""
        if form == "markdown":
            print(caption + "\n")
            print(markdown_table(ranked, metrics, marks, pairs))
        elif form == "csv":
            print(csv_table(ranked, metrics, marks, pairs))
        else:
            print(latex_table(ranked, metrics, marks, pairs, caption))
        notes += clipped_notes(ranked, metrics)
        notes += [f"setting {i}: runs {', '.join(run.name for run in g.runs)}" for i, g in enumerate(ranked, 1)]
        notes += code_notes(ranked, pool_code) + repeat_notes(ranked, over) + filled_notes(finished)
        written = plot(ranked, out, metric)
        if written:
            notes.append(f"curves in {out.resolve()}: {', '.join(path.name for path in written)}")
    notes += [f"not averaged: {run.name}: {not_finished(run)}" for run in apart]
    stream = sys.stdout if form == "markdown" else sys.stderr
    print(("\n" if form == "markdown" else "") + "\n".join(notes), file=stream)
    return 0


def clipped_notes(ranked: list, metrics: list) -> list:
    """The footnote for intervals clipped to their metric's range, naming each such metric's range."""
    clipped = [m for m in metrics if any(group.stats(m).clipped for group in ranked)]
    if not clipped:
        return []
    runs = [run for group in ranked for run in group.runs]
    ranges = []
    for metric in clipped:
        low, high = metric_range(runs, metric)
        limits = f"in [{low}, {high}]" if None not in (low, high) else f">= {low}" if low is not None else f"<= {high}"
        ranges.append(f"{header(metric)} {limits}")
    return [
        f"{CLIPPED} interval clipped to the metric's range ({'; '.join(ranges)}; the task's, as summary.json records "
        "it): the t-interval itself runs past it"
    ]


def code_notes(ranked: list, pool_code: bool) -> list:
    """Runs continued across code versions, runs whose code is unknown, and with --pool-code the settings that
    pool runs of several code versions."""
    notes = []
    runs = [run for group in ranked for run in group.runs]
    for run in runs:
        if run.code and ", then " in run.code:
            notes.append(f"mixed code: {run.name} was continued across code versions ({run.code})")
    unknown = [run.name for run in runs if run.code is None]
    if unknown:
        notes.append(
            f"code versions unknown for {', '.join(unknown)} (no provenance.json, or no commit in it): the table "
            "cannot tell whether they ran the same code"
        )
    for i, group in enumerate(ranked, 1):
        versions: dict = {}
        for run in group.runs:
            versions.setdefault(run.code or "unknown", []).append(run.name)
        if pool_code and len(versions) > 1:
            listed = "; ".join(f"{code} ({', '.join(names)})" for code, names in versions.items())
            notes.append(f"setting {i} pools {len(versions)} code versions (--pool-code): {listed}")
    return notes


def repeat_notes(ranked: list, over: tuple) -> list:
    """A seed (and fold) that repeats within a setting: those runs are not independent samples."""
    notes = []
    for i, group in enumerate(ranked, 1):
        seen: dict = {}
        for run in group.runs:
            seen.setdefault(over_values(run, over) or "(no seed set)", []).append(run.name)
        for values, names in seen.items():
            if len(names) > 1:
                notes.append(
                    f"setting {i}: {values} repeats in runs {', '.join(names)}: they are not independent samples"
                )
    return notes


def filled_notes(runs: list) -> list:
    """What the runs filled in themselves, listed apart from the settings: `key=value` where every run has the
    same value, else each value with its runs; and the keys not compared for runs recorded before filled_in.yaml."""
    older = [run.name for run in runs if run.unknown]
    notes = []
    if older:
        keys = ", ".join(key for key in KNOWN_FILLED_IN if any(key in run.unknown for run in runs))
        notes.append(
            f"{len(older)} run{'s' if len(older) > 1 else ''} recorded before {FILLED_IN} ({', '.join(older)}): "
            f"{keys} (keys a run may fill in itself) not compared"
        )
    keys = dict.fromkeys(key for run in runs for key in run.filled)
    if not keys:
        return notes
    parts = []
    for key in keys:
        values: dict = {}
        for run in runs:
            if key in run.filled:
                values.setdefault(_text(run.filled[key]), []).append(run.name)
        if len(values) == 1:
            parts.append(f"{key}={next(iter(values))}")
        else:
            parts.append(f"{key}: " + ", ".join(f"{value} ({' '.join(names)})" for value, names in values.items()))
    return [*notes, f"filled in by the runs, not settings: {'; '.join(parts)}"]


# --- two runs diffed -----------------------------------------------------------------------------------------


def columns(rows: list, indent: str = "  ") -> list:
    """Rows of cells as aligned lines."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def config_differences(a: dict, b: dict) -> dict:
    """{key: (A's value, B's value)} for each flat config key whose values differ (absent: "(absent)")."""
    pairs = {key: (a.get(key, "(absent)"), b.get(key, "(absent)")) for key in dict.fromkeys([*a, *b])}
    return {key: (x, y) for key, (x, y) in pairs.items() if _text(x) != _text(y)}


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def code_lines(a: Path, b: Path) -> list:
    """The commit of each (provenance.json) and whether their uncommitted changes (code.diff) differ."""
    facts = [(read_json(run / "provenance.json") or {}).get("git") or {} for run in (a, b)]
    commits = [fact.get("commit") for fact in facts]
    if commits[0] == commits[1]:
        commit = f"commit {commits[0][:7]} in both" if commits[0] else "no commit recorded in either"
    else:
        commit = f"commit {(commits[0] or 'none')[:7]} (A), {(commits[1] or 'none')[:7]} (B)"
    diffs = [(run / "code.diff").read_bytes() if (run / "code.diff").is_file() else None for run in (a, b)]
    if diffs[0] == diffs[1]:
        changes = "the same uncommitted changes in both (code.diff)" if diffs[0] else "no uncommitted changes in either"
    else:
        sizes = [f"{len(d.splitlines())} lines of code.diff" if d else "none" for d in diffs]
        changes = f"the uncommitted changes differ (A: {sizes[0]}; B: {sizes[1]})"
    return [f"code: {commit}; {changes}"]


def packages(run: Path) -> dict | None:
    listed = run / "packages.txt"
    if not listed.is_file():
        return None
    lines = listed.read_text(encoding="utf-8").splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def package_lines(a: Path, b: Path) -> list:
    found = [packages(a), packages(b)]
    if None in found:
        return [f"packages: not recorded in {' and '.join(str(r) for r, p in zip((a, b), found) if p is None)}"]
    first, second = found
    names = sorted(name for name in {*first, *second} if first.get(name) != second.get(name))
    differ = [(name, first.get(name, "-"), second.get(name, "-")) for name in names]
    if not differ:
        return [f"packages: the same {len(first)} (packages.txt)"]
    return [f"packages: {len(differ)} differ", *columns([("package", "A", "B"), *differ])]


def machine(run: Path) -> dict:
    facts = read_json(run / "provenance.json") or {}
    torch_facts, cpu = facts.get("torch") or {}, facts.get("cpu") or {}
    gpus = ", ".join(f"{g.get('name')} ({g.get('memory_gb')} GB)" for g in facts.get("gpus") or []) or "none"
    return {
        "hostname": facts.get("hostname"),
        "cpu": cpu.get("model"),
        "cores": f"{cpu.get('cores_usable')} of {cpu.get('cores')}",
        "gpus": gpus,
        "device": facts.get("device"),
        "world_size": facts.get("world_size"),
        "python": facts.get("python"),
        "torch": torch_facts.get("version"),
        "cuda": torch_facts.get("cuda"),
        "cudnn": torch_facts.get("cudnn"),
    }


def machine_lines(a: Path, b: Path) -> list:
    first, second = machine(a), machine(b)
    differ = [(key, first[key], second[key]) for key in first if first[key] != second[key]]
    if not differ:
        return ["machine: the same (" + ", ".join(f"{key} {value}" for key, value in first.items()) + ")"]
    return [f"machine: {len(differ)} facts differ", *columns([("fact", "A", "B"), *differ])]


def fingerprint(run: Path) -> tuple[dict | None, str]:
    """The data fingerprint a run's checkpoint keeps (last.pt, else best.pt; read lazily), and where it came from."""
    from trainkit.checkpointing.files import latest_checkpoint, read_checkpoint
    from trainkit.errors import ConfigError

    checkpoints = run / "checkpoints"
    path = latest_checkpoint(checkpoints) if checkpoints.is_dir() else None
    path = path or (checkpoints / "best.pt" if (checkpoints / "best.pt").is_file() else None)
    if path is None:
        return None, f"no checkpoint in {checkpoints}"
    try:
        return read_checkpoint(path, mmap=True).get("data") or None, str(path.relative_to(run))
    except ConfigError as error:
        return None, str(error)


def data_lines(a: Path, b: Path) -> list:
    """The data of two runs: their checkpoints' fingerprints (the splits, and what was read before them), else what
    their summary.json records as read; where one of them records no digest of its files, a note that their
    contents were not compared."""
    from trainkit.data.fingerprint import data_changes

    (first, where_a), (second, where_b) = fingerprint(a), fingerprint(b)
    if first is None or second is None:
        read = [(read_json(run / "summary.json") or {}).get("data") for run in (a, b)]
        if not all(read):
            return [f"data: no fingerprint to compare (A: {where_a}; B: {where_b})"]
        first, second, where_a, where_b = {"identity": read[0]}, {"identity": read[1]}, "summary.json", "summary.json"
    changes = data_changes(first, second)
    line = f"data: B's differs from A's: {'; '.join(changes)}" if changes else "data: the same fingerprint"
    return [f"{line} ({where_a}, {where_b}){_contents_not_compared(first, second)}"]


def _contents_not_compared(first: dict, second: dict) -> str:
    """A note where one run records digests of its files' contents and the other, from before them, records none."""
    from trainkit.data.fingerprint import lacks_file_digests

    older = [x for x, found in (("A", first), ("B", second)) if found.get("identity") is None]
    other = second if older == ["A"] else first
    if len(older) != 1 or lacks_file_digests(other.get("identity")):
        return ""
    return f"; the files' contents not compared: {older[0]} is a run from before their digests were recorded"


def metric_lines(a: Run, b: Run) -> list:
    gone = [f"{x} ({not_finished(run)})" for x, run in (("A", a), ("B", b)) if run.summary is None]
    if gone:
        return [f"metrics: none for {' and '.join(gone)}"]
    first = a.summary.get("optimized_metric") or "val/acc"
    rows = []
    for metric in summary_metrics([a, b], first):
        values = [metric_value(a, metric), metric_value(b, metric)]
        digits = 1 if metric == WALL else 4
        difference = values[1] - values[0] if None not in values else None
        signed = "-" if difference is None else f"{'+' if difference >= 0 else ''}{_number(difference, digits)}"
        rows.append((header(metric), _number(values[0], digits), _number(values[1], digits), signed))
    rows.append(("epochs", a.summary.get("epochs", "-"), b.summary.get("epochs", "-"), ""))
    return ["metrics (summary.json):", *columns([("metric", "A", "B", "B - A"), *rows])]


def filled_lines(a: Run, b: Run) -> list:
    """What each run filled in itself (.hydra/filled_in.yaml; an older run: the keys known to be filled in), apart
    from the settings: one line where both filled in the same, else one row per key."""
    keys = list(dict.fromkeys([*a.filled, *b.filled]))
    if not keys:
        return []
    if all(key in a.filled and key in b.filled and _text(a.filled[key]) == _text(b.filled[key]) for key in keys):
        return ["filled in by the run, not settings: " + ", ".join(f"{key}={_text(a.filled[key])}" for key in keys)]
    rows = [(key, *(_text(run.filled[key]) if key in run.filled else "-" for run in (a, b))) for key in keys]
    return ["filled in by the run, not settings:", *columns([("key", "A", "B"), *rows])]


def diff(a: Path, b: Path) -> str:
    runs = [load_run(path, path) for path in (a, b)]
    unknown = runs[0].unknown | runs[1].unknown
    differ = config_differences(*(settings_of(run, (), unknown) for run in runs))
    rows = [(key, _text(x), _text(y)) for key, (x, y) in differ.items()]
    count = "1 key differs" if len(differ) == 1 else f"{len(differ)} keys differ"
    source = ".hydra/config.yaml, resolved: what was set"
    config = [f"config: {count} ({source})", *columns([("key", "A", "B"), *rows])]
    if not differ:
        config = [f"config: the same ({source})"]
    watched = [key for key in config_differences(runs[0].config, runs[1].config) if is_over(key, NOT_SETTINGS)]
    if watched:
        config.append(f"also differ, not settings (how a run is watched or resumed): {', '.join(watched)}")
    lines = [f"A: {a}", f"B: {b}", "", *config, *filled_lines(*runs), *code_lines(a, b), *package_lines(a, b)]
    return "\n".join([*lines, *machine_lines(a, b), *data_lines(a, b), *metric_lines(*runs)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", type=Path, nargs="*", metavar="PATH", help="run directories, directories above runs, or globs"
    )
    parser.add_argument("--diff", type=Path, nargs=2, metavar=("RUN_A", "RUN_B"), help="what differs between two runs")
    parser.add_argument(
        "--over", default=OVER, help=f"config keys whose values a setting's runs may differ in (default: {OVER})"
    )
    parser.add_argument(
        "--metric", default=None, help="rank by this metric (val/loss, test/acc, ...); default: the optimized_metric"
    )
    parser.add_argument("--format", choices=("markdown", "csv", "latex"), default="markdown", help="the table's format")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the PNGs (default: PATH/compare; several PATHs: ./compare)"
    )
    parser.add_argument(
        "--pool-code",
        action="store_true",
        help="average runs of other code (commit, uncommitted changes) as one setting; the table says it did",
    )
    args = parser.parse_args(argv)
    if bool(args.diff) == bool(args.paths):
        parser.error("give PATH... to compare runs, or --diff RUN_A RUN_B (not both)")
    paths = args.diff or expand(args.paths)
    for path in paths:
        if not path.is_dir():
            parser.error(
                f"{path}: no such directory"
                + (" (the pattern matched nothing)" if path in args.paths and glob.has_magic(str(path)) else "")
            )
    if args.diff:
        for run in args.diff:
            if not (run / "metrics.jsonl").is_file() and not (run / ".hydra").is_dir():
                parser.error(f"{run}: not a run directory (no metrics.jsonl, no .hydra/): --diff takes two runs")
        print(diff(*args.diff))
        return 0
    several = len(paths) > 1  # names then start with their PATH's own name: two runs' "." differ
    runs = [load_run(run, path, f"{path.name}/" if several else "") for path in paths for run in find_runs(path)]
    if not runs:
        where = " ".join(str(path) for path in paths)
        print(f"error: no run directory (with a metrics.jsonl or .hydra/) at or below {where}", file=sys.stderr)
        return 1
    over = tuple(key.strip() for key in args.over.split(",") if key.strip())
    out = args.out or (Path("compare") if several else paths[0] / "compare")
    return compare(runs, over, args.metric, args.format, out, args.pool_code)


if __name__ == "__main__":
    sys.exit(main())
