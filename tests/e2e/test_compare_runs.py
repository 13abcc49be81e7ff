"""scripts/compare_runs.py on hand-made run directories (the statistics with known numbers, grouping, ranking and
separability, the formats, refusals, unfinished runs, the PNGs, --diff) and once on a real multirun."""

import csv
import hashlib
import io
import json
import shutil

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import run_here
from helpers import load_script, sigterm_in_job

compare_runs = load_script("compare_runs")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = {
    "seed": 0,
    "resume": None,
    "task": {"_target_": "trainkit.tasks.classification.Classification", "num_classes": "${data.num_classes}"},
    "data": {"_target_": "trainkit.data.datasets.Digits", "name": "digits", "num_classes": 10, "batch_size": 64},
    "optimizer": {"lr": 0.1},
    "trainer": {"max_epochs": 2},
}


FILLED = (
    "filled in by the run, not settings: optimized_metric=val/acc, regularization.early_stopping.monitor=val/loss, "
    "regularization.early_stopping.mode=min"
)  # the task's defaults, which conf/ leaves null


def make_run(path, overrides, val_acc, val_loss, test_acc=None, summary=True, metric="val/acc", **summary_extra):
    """A run directory as train.py leaves it: its config and overrides, per-epoch and per-step rows, then test
    metrics and summary.json (`summary=False`: killed mid-line, no summary.json)."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    config = OmegaConf.create(CONFIG)
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        OmegaConf.update(config, key, yaml.safe_load(value), force_add=True)
    OmegaConf.save(config, path / ".hydra" / "config.yaml")
    rows = []
    for epoch, (acc, loss) in enumerate(zip(val_acc, val_loss)):
        rows.append({"epoch": epoch, "step": 10 * epoch + 5, "train/step_loss": 9.9, "lr": 0.1})
        rows.append(
            {
                "epoch": epoch,
                "step": 10 * epoch + 10,
                "train/loss": loss + 0.1,
                "train/acc": acc,
                "val/loss": loss,
                "val/acc": acc,
                "lr": 0.1,
            }
        )
    if summary:
        rows.append({"epoch": len(val_acc) - 1, "step": 10 * len(val_acc), "test/loss": 0.5, "test/acc": test_acc})
    lines = [json.dumps(r) for r in rows] + (['{"epoch": 9, "val/lo'] if not summary else [])  # killed mid-line
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        best = max(range(len(val_acc)), key=lambda i: val_acc[i])
        best_metrics = {"epoch": best, "val/loss": val_loss[best], "val/acc": val_acc[best]}
        facts = {
            "best": best_metrics,
            "final": {"val/acc": val_acc[-1]},
            "test": {"test/loss": 0.5, "test/acc": test_acc},
            "optimized_metric": metric,
            "optimized_value": best_metrics[metric],
            "higher_is_better": {"loss": False, "acc": True},  # the task's direction, as train.py records it
            "stop_reason": "max_epochs",
            "epochs": len(val_acc),
            "wall_seconds": 12.34,
        }
        (path / "summary.json").write_text(json.dumps({**facts, **summary_extra}))


def seeds(root, lr, values, first_job, first_seed=0):
    """One setting (optimizer.lr=`lr`) trained with a seed per value (from `first_seed`): its best val/acc is the
    value."""
    for k, value in enumerate(values):
        overrides = [f"seed={first_seed + k}", f"optimizer.lr={lr}", "trainer.max_epochs=2"]
        make_run(root / str(first_job + k), overrides, [value - 0.1, value], [1.0, 1 - value], test_acc=value)


def table_rows(text):
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not line.startswith("|---") and "rank" not in line
    ]


@pytest.fixture
def sweep(tmp_path):
    """Two settings of three seeds each, one of them with a run killed before its summary and one diverged."""
    root = tmp_path / "sweep"
    seeds(root, 0.1, [0.90, 0.91, 0.92], 0)
    seeds(root, 0.03, [0.89, 0.90, 0.91], 3)
    make_run(root / "6", ["seed=3", "optimizer.lr=0.1", "trainer.max_epochs=2"], [0.1], [5.0], summary=False)
    make_run(
        root / "7", ["seed=4", "optimizer.lr=0.1", "trainer.max_epochs=2"], [0.1], [9.0], stop_reason="non-finite loss"
    )
    return root


def test_the_statistics_of_one_to_five():
    stats = compare_runs.Stats([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats.n == 5 and stats.mean == 3.0
    assert stats.std == pytest.approx(1.5811, abs=1e-4)  # sample std: sqrt(10 / 4)
    assert compare_runs.t_quantile(4) == pytest.approx(2.7764, abs=1e-4)
    assert stats.half_width == pytest.approx(1.9632, abs=1e-4)
    assert stats.interval == pytest.approx((1.0368, 4.9632), abs=1e-4)
    one = compare_runs.Stats([0.7])
    assert one.std is None and one.interval is None
    assert compare_runs.cell(one, 1, "val/acc") == "0.7000 (n=1)"


def test_seeds_of_one_setting_are_averaged_and_unfinished_runs_listed_apart(sweep, capsys):
    assert compare_runs.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [row[:3] for row in rows] == [["1", "`optimizer.lr=0.1`", "3"], ["2", "`optimizer.lr=0.03`", "3"]]
    assert rows[0][3] == "0.9100 ± 0.0100 [0.8852, 0.9348]"  # 4.3027 * 0.01 / sqrt(3) = 0.0248
    # Their intervals overlap, but each seed of lr=0.03 is 0.01 below the same seed of lr=0.1: paired, it is worse.
    assert rows[0][-3:] == ["t", "-", "**best**"]
    assert rows[1][-3:] == ["t", "-0.0100 [-0.0100, -0.0100] (n=3)", "worse"]
    assert "ranked by val/acc, higher is better" in out and "all runs: `trainer.max_epochs=2`" in out
    assert "setting 1: runs 0, 1, 2" in out and "setting 2: runs 3, 4, 5" in out
    assert "not averaged: 6: unfinished (stopped, failed or still running): no summary.json" in out
    assert "not averaged: 7: diverged: summary.json's stop_reason is non-finite loss" in out
    for curve in ("train_loss", "val_loss", "val_acc"):
        assert (sweep / "compare" / f"{curve}.png").read_bytes()[:8] == PNG_MAGIC


def test_groups_form_over_the_over_keys_and_a_run_without_data_fold_has_none(tmp_path, capsys):
    root = tmp_path / "folds"
    for fold in range(3):  # 3 folds of one seed, and a run of the same setting that had no folds at all
        make_run(root / str(fold), ["+data.folds=3", f"+data.fold={fold}"], [0.5, 0.8 + fold / 100], [1, 0.5], 0.8)
    make_run(root / "3", ["seed=1", "+data.folds=3", "+data.fold=0"], [0.5, 0.84], [1, 0.5], 0.8)
    make_run(root / "4", ["seed=1"], [0.5, 0.7], [1, 0.5], 0.7)
    assert compare_runs.main([str(root)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [(row[1], row[2]) for row in rows] == [("`data.folds=3`", "4"), ("`data.folds=null`", "1")]
    assert rows[1][3] == "0.7000 (n=1)" and rows[1][-3:] == ["-", "-", "no interval (n=1)"]
    assert compare_runs.main([str(root), "--over", "data.fold"]) == 0  # seeds now set settings apart
    rows = table_rows(capsys.readouterr().out)
    assert [(row[1], row[2]) for row in rows] == [
        ("`seed=1 data.folds=3`", "1"),
        ("`seed=0 data.folds=3`", "3"),
        ("`seed=1 data.folds=null`", "1"),
    ]


def test_ranking_marks_the_best_and_what_is_not_separable_from_it(tmp_path, capsys):
    root = tmp_path / "sweep"
    # Each setting its own seeds: nothing pairs, the intervals decide.
    seeds(root, 0.5, [0.50, 0.51, 0.52], 0, first_seed=0)  # far below the best: separable, worse
    seeds(root, 0.1, [0.90, 0.91, 0.92], 3, first_seed=3)  # the best
    seeds(root, 0.03, [0.89, 0.90, 0.91], 6, first_seed=6)  # its interval overlaps the best's
    seeds(root, 0.01, [0.70], 9, first_seed=9)  # one run: no interval
    assert compare_runs.main([str(root)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [(row[1], row[-1]) for row in rows] == [
        ("`optimizer.lr=0.1`", "**best**"),
        ("`optimizer.lr=0.03`", "not separable"),
        ("`optimizer.lr=0.01`", "no interval (n=1)"),
        ("`optimizer.lr=0.5`", "worse"),
    ]
    assert compare_runs.main([str(root), "--metric", "val/loss"]) == 0  # a loss: lowest first (1 - val/acc here)
    rows = table_rows(capsys.readouterr().out)
    assert [row[1] for row in rows][:2] == ["`optimizer.lr=0.1`", "`optimizer.lr=0.03`"]
    assert rows[0][3].startswith("0.0900 ± 0.0100")


@pytest.fixture
def one_to_five(tmp_path):
    """Five seeds whose test/acc are 1..5, and one other setting of one run."""
    root = tmp_path / "sweep"
    for k in range(5):
        make_run(root / str(k), [f"seed={k}", "data.batch_size=32"], [0.5, 0.9], [1, 0.5], test_acc=float(k + 1))
    make_run(root / "5", ["data.batch_size=64"], [0.5, 0.6], [1, 0.5], test_acc=0.5)
    return root


def test_the_csv_and_latex_tables_hold_the_known_numbers(one_to_five, capsys):
    assert compare_runs.main([str(one_to_five), "--format", "csv", "--metric", "test/acc"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [row["setting"] for row in rows] == ["data.batch_size=32", "data.batch_size=64"]
    first = rows[0]
    assert first["n"] == "5" and float(first["test/acc"]) == 3.0
    assert float(first["test/acc_std"]) == pytest.approx(1.5811, abs=1e-4)
    assert float(first["test/acc_ci_low"]) == pytest.approx(1.0368, abs=1e-4)
    assert float(first["test/acc_ci_high"]) == pytest.approx(4.9632, abs=1e-4)
    assert first["runs"] == "0 1 2 3 4" and first["vs_best"] == "best"
    assert rows[1]["test/acc_std"] == "" and rows[1]["vs_best"] == "no interval (n=1)"
    assert "setting 1: runs 0, 1, 2, 3, 4" in err  # the notes stay out of the table's output

    assert compare_runs.main([str(one_to_five), "--format", "latex", "--metric", "test/acc"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == r"\begin{tabular}{rlrllllllll}" and out.rstrip().endswith(r"\end{tabular}")
    assert r"1 & data.batch\_size=32 & 5 & $3.0000 \pm 1.5811$ [1.0368, 4.9632] & " in out
    assert r"\textbf{best} \\" in out and r"$0.5000$ ($n=1$)" in out


def test_runs_of_different_tasks_or_data_are_refused_in_one_line(tmp_path, capsys):
    make_run(tmp_path / "a", ["seed=0"], [0.5], [1.0], 0.5)
    make_run(tmp_path / "b", ["seed=1", "task._target_=my_project.Detection"], [0.5], [1.0], 0.5)
    make_run(tmp_path / "c", ["seed=2", "data.name=mnist"], [0.5], [1.0], 0.5)
    assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: a and c are runs of different tasks or data (data.name=digits vs mnist): their metrics do not "
        "compare; give compare_runs.py the runs of one task and data"
    ]
    assert compare_runs.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "task._target_=trainkit.tasks.classification.Classification vs " in err


def ranked_sweep(root, metric: str, values: list, higher_is_better: dict | None) -> None:
    """Runs of another task, as summary.json alone says (no acc anywhere): `metric` at its best epoch."""
    for k, value in enumerate(values):
        (root / str(k)).mkdir(parents=True)
        (root / str(k) / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "step": 5, metric: value}) + "\n")
        summary = {"best": {"epoch": 0, metric: value}, "optimized_metric": metric, "optimized_value": value}
        if higher_is_better is not None:
            summary["higher_is_better"] = higher_is_better
        (root / str(k) / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize(
    "metric, direction, ranked",
    [
        ("val/miou", {"loss": False, "miou": True}, ["0.8000 (n=1)", "0.5000 (n=1)", "0.3000 (n=1)"]),
        ("val/bpb", {"loss": False, "bpb": False}, ["0.3000 (n=1)", "0.5000 (n=1)", "0.8000 (n=1)"]),
    ],
    ids=["segmentation", "language_model"],
)
def test_settings_rank_in_the_direction_their_task_recorded(tmp_path, capsys, metric, direction, ranked):
    """Runs without a config (no .hydra/) and no overrides: nothing sets them apart but what they hold."""
    ranked_sweep(tmp_path, metric, [0.3, 0.8, 0.5], direction)
    for k in range(3):  # each its own setting: a distinct override
        (tmp_path / str(k) / ".hydra").mkdir()
        (tmp_path / str(k) / ".hydra" / "overrides.yaml").write_text(f"- model.width={k}\n")
    assert compare_runs.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert [r[3] for r in table_rows(out)] == ranked and err == ""


def test_runs_from_before_the_direction_was_recorded_rank_higher_first_with_a_warning(tmp_path, capsys):
    ranked_sweep(tmp_path, "val/miou", [0.3, 0.8, 0.5], None)
    assert compare_runs.main([str(tmp_path), "--over", ""]) == 0
    out, err = capsys.readouterr()
    assert [r[2] for r in table_rows(out)] == ["3"]  # one setting: nothing tells them apart
    assert err.splitlines() == [
        "warning: no summary.json here records whether a higher val/miou is better (runs from before it was "
        "recorded): ranked higher first, as every metric but a loss is by default; if that is wrong, add "
        '"higher_is_better": {"miou": false} to their summary.json'
    ]


def test_epoch_curves_skip_step_rows_and_broken_lines(sweep):
    curves = compare_runs.read_metrics(sweep / "0" / "metrics.jsonl")
    assert curves["val/acc"] == pytest.approx({0: 0.8, 1: 0.9})
    assert curves["train/loss"] == pytest.approx({0: 1.1, 1: 0.2})
    assert "train/step_loss" not in curves
    assert compare_runs.read_metrics(sweep / "6" / "metrics.jsonl")["val/acc"] == {0: 0.1}


def test_a_single_run_directory_and_a_path_without_runs(sweep, tmp_path, capsys):
    assert compare_runs.main([str(sweep / "4")]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [row[:4] for row in rows] == [["1", "`(all runs)`", "1", "0.9000 (n=1)"]]
    (tmp_path / "empty").mkdir()
    assert compare_runs.main([str(tmp_path / "empty")]) == 1
    assert "no run directory" in capsys.readouterr().err


def test_a_curve_is_each_settings_mean_in_a_band_on_whole_epochs(tmp_path):
    root = tmp_path / "short"
    make_run(root / "0", ["seed=1"], [0.5], [1.0], test_acc=0.5)
    make_run(root / "1", ["seed=2"], [0.7], [0.9], test_acc=0.6)
    runs = [compare_runs.load_run(path, root) for path in compare_runs.find_runs(root)]
    groups = compare_runs.group_runs(runs, ("seed",))
    assert compare_runs.mean_curve(groups[0], "val/acc") == [(0, pytest.approx(0.6), 0.5, 0.7)]
    figure = compare_runs.draw(groups, "val/acc")
    (ax,) = figure.axes
    low, high = ax.get_xlim()
    assert low <= -0.5 and high >= 0.5  # not matplotlib's -0.045..0.045 around a lone epoch 0
    assert [tick for tick in ax.get_xticks() if low <= tick <= high] == [0]  # whole epochs only
    (line,) = ax.get_lines()
    assert line.get_marker() == "o" and line.get_markersize() >= 5 and line.get_ydata()[0] == pytest.approx(0.6)
    assert len(ax.collections) == 1  # the band


def test_several_paths_a_glob_and_symlinked_run_directories_are_compared(sweep, tmp_path, capsys, monkeypatch):
    """Two runs side by side (each named from its PATH), a quoted glob, and a folder of symlinks to runs."""
    out = tmp_path / "ab"
    assert compare_runs.main([str(sweep / "0"), str(sweep / "3"), "--out", str(out), "--over", ""]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [row[1] for row in rows] == ["`optimizer.lr=0.1`", "`optimizer.lr=0.03`"]
    assert (out / "val_acc.png").read_bytes()[:8] == PNG_MAGIC
    assert compare_runs.main([str(sweep / "[34]"), "--out", str(out)]) == 0  # as a shell leaves a quoted pattern
    assert "setting 1: runs 3, 4" in capsys.readouterr().out
    links = tmp_path / "compare"
    links.mkdir()
    for job in ("0", "1"):
        (links / f"job{job}").symlink_to(sweep / job, target_is_directory=True)
    (links / "loop").symlink_to(links, target_is_directory=True)  # a cycle is walked once
    monkeypatch.chdir(tmp_path)
    assert compare_runs.main([str(links), "--out", str(out)]) == 0
    assert "setting 1: runs job0, job1" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # argparse's one line: the pattern matched nothing
        compare_runs.main([str(tmp_path / "nothing*")])
    assert "nothing*: no such directory (the pattern matched nothing)" in capsys.readouterr().err


def provenance(run, commit, packages, diff=None):
    facts = {"git": {"commit": commit}, "hostname": "node1", "cpu": {"model": "cpu", "cores": 4}, "python": "3.11.7"}
    (run / "provenance.json").write_text(json.dumps(facts))
    (run / "packages.txt").write_text("".join(f"{name}=={version}\n" for name, version in packages.items()))
    if diff is not None:
        (run / "code.diff").write_text(diff)


def test_diff_names_exactly_the_keys_packages_and_code_that_differ(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    make_run(a, ["seed=0"], [0.5, 0.9], [1.0, 0.2], test_acc=0.8)
    make_run(b, ["seed=1", "data.batch_size=32", "+model.width=8"], [0.5, 0.8], [1.0, 0.3], test_acc=0.75)
    provenance(a, "a" * 40, {"torch": "2.4.0", "numpy": "2.0.0"})
    provenance(b, "a" * 40, {"torch": "2.4.0", "numpy": "2.1.0"}, diff="diff --git a/x b/x\n+y\n")
    differ = compare_runs.config_differences(compare_runs.read_config(a), compare_runs.read_config(b))
    assert differ == {"seed": (0, 1), "data.batch_size": (64, 32), "model.width": ("(absent)", 8)}
    assert compare_runs.main(["--diff", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    config = lines[lines.index("config: 3 keys differ (.hydra/config.yaml, resolved: what was set)") + 1 :][:4]
    assert [line.split() for line in config] == [
        ["key", "A", "B"],
        ["seed", "0", "1"],
        ["data.batch_size", "64", "32"],
        ["model.width", "(absent)", "8"],
    ]
    assert "code: commit aaaaaaa in both; the uncommitted changes differ (A: none; B: 2 lines of code.diff)" in lines
    packages = lines[lines.index("packages: 1 differ") + 1 :][:2]
    assert [line.split() for line in packages] == [["package", "A", "B"], ["numpy", "2.0.0", "2.1.0"]]
    assert lines[lines.index("packages: 1 differ") + 3].startswith("machine: the same (hostname node1, cpu cpu, ")
    assert f"data: no fingerprint to compare (A: no checkpoint in {a / 'checkpoints'}; B: " in "\n".join(lines)
    metrics = [line.split() for line in lines[lines.index("metrics (summary.json):") + 1 :]]
    assert metrics[:3] == [
        ["metric", "A", "B", "B", "-", "A"],
        ["val/acc", "0.9000", "0.8000", "-0.1000"],
        ["test/loss", "0.5000", "0.5000", "+0.0000"],
    ]
    assert ["test/acc", "0.8000", "0.7500", "-0.0500"] in metrics


def test_diff_of_a_run_with_itself_says_the_same(tmp_path, capsys):
    make_run(tmp_path / "a", ["seed=0"], [0.5], [1.0], test_acc=0.8)
    provenance(tmp_path / "a", None, {"torch": "2.4.0"})
    assert compare_runs.main(["--diff", str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "config: the same (.hydra/config.yaml, resolved: what was set)" in out
    assert "code: no commit recorded in either; no uncommitted changes in either" in out
    assert "packages: the same 1 (packages.txt)" in out
    with pytest.raises(SystemExit):  # a sweep is not a run
        compare_runs.main(["--diff", str(tmp_path), str(tmp_path / "a")])
    assert (
        f"{tmp_path}: not a run directory (no metrics.jsonl, no .hydra/): --diff takes two runs"
        in capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_real_multirun_gives_two_settings_of_two_seeds_and_its_runs_diff(tmp_path):
    sweep = tmp_path / "sweep"
    tiny = ("trainer.max_epochs=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1")
    code, _, err = run_here("train.py", "-m", "seed=0,1", "optimizer.lr=0.1,0.03", *tiny, f"hydra.sweep.dir={sweep}")
    assert code == 0, err[-3000:]
    code, out, err = run_here("scripts/compare_runs.py", str(sweep))
    assert code == 0, err
    rows = table_rows(out)
    assert sorted((row[1], row[2]) for row in rows) == [("`optimizer.lr=0.03`", "2"), ("`optimizer.lr=0.1`", "2")]
    assert all(" ± " in row[3] for row in rows) and {rows[0][-1], rows[1][-1]} <= {"**best**", "not separable", "worse"}
    pngs = sorted(path.name for path in (sweep / "compare").iterdir())
    assert pngs == ["train_loss.png", "val_acc.png", "val_loss.png"]
    code, out, err = run_here("scripts/compare_runs.py", "--diff", str(sweep / "0"), str(sweep / "3"))
    assert code == 0, err
    lines = out.splitlines()
    header = lines.index("config: 2 keys differ (.hydra/config.yaml, resolved: what was set)")
    assert sorted(line.split()[0] for line in lines[header + 2 :][:2]) == ["optimizer.lr", "seed"]
    assert lines[header + 4] == FILLED
    assert lines[header + 5].startswith("code: ")
    assert "packages: the same " in out and "machine: the same (" in out
    assert "data: the same fingerprint (checkpoints/last.pt, checkpoints/last.pt)" in out


@pytest.mark.slow
def test_a_continued_sweep_is_one_setting_and_a_continued_run_diffs_as_its_twin(tmp_path, monkeypatch):
    """`train.py -m seed=1,2,3`, job 1 stopped by SIGTERM (exit 75) and the same command rerun to continue it: one
    setting of n=3 whose mean is that of the three summary.json values; job 1 and a run of seed=2 that never
    stopped differ in no setting, and what the run filled in is listed apart."""
    sweep, twin = tmp_path / "sweep", tmp_path / "twin"
    tiny = ("debug=fast", "trainer.max_epochs=1", "data.batch_size=8", "print_config=false")
    command = ("-m", *tiny, "seed=1,2,3", f"hydra.sweep.dir={sweep}")
    sigterm_in_job(monkeypatch, 1)
    assert run_here("train.py", *command)[0] == 75
    monkeypatch.undo()
    code, _, err = run_here("train.py", *command)  # the documented way to continue
    assert code == 0, err[-3000:]
    code, out, err = run_here("scripts/compare_runs.py", str(sweep))
    assert code == 0, err
    values = [json.loads((sweep / str(job) / "summary.json").read_text())["optimized_value"] for job in range(3)]
    (row,) = table_rows(out)
    assert row[1:3] == ["`(all runs)`", "3"] and row[3].startswith(f"{sum(values) / 3:.4f} ± ")
    assert "setting 1: runs 0, 1, 2" in out
    code, _, err = run_here("train.py", *tiny, "seed=2", f"hydra.run.dir={twin}")
    assert code == 0, err[-3000:]
    code, out, err = run_here("scripts/compare_runs.py", "--diff", str(twin), str(sweep / "1"))
    assert code == 0, err
    assert "config: the same (.hydra/config.yaml, resolved: what was set)" in out.splitlines()
    assert FILLED in out.splitlines()


def filled_in(run, values):
    """What train.py records a run filled in itself (.hydra/filled_in.yaml)."""
    (run / ".hydra" / "filled_in.yaml").write_text(yaml.safe_dump(values))


def test_what_a_run_filled_in_is_no_setting_in_the_table_or_the_diff(tmp_path, capsys):
    """A continued run's config.yaml from before filled_in.yaml holds what the run filled in (optimized_metric,
    data.vocabulary) where its siblings hold null: it is read through the keys known to be filled in. Runs that
    record filled_in.yaml are grouped on what was set and list the rest apart."""
    old, new = tmp_path / "old", tmp_path / "new"
    for k in range(3):
        continued = ["+optimized_metric=val/acc", "+data.vocabulary=257"] if k == 1 else []
        make_run(old / str(k), [f"seed={k}"], [0.5, 0.9], [1.0, 0.5], 0.9)
        config = OmegaConf.load(old / str(k) / ".hydra" / "config.yaml")
        for override in continued or ["+optimized_metric=null", "+data.vocabulary=null"]:
            key, _, value = override.lstrip("+").partition("=")
            OmegaConf.update(config, key, yaml.safe_load(value), force_add=True)
        OmegaConf.save(config, old / str(k) / ".hydra" / "config.yaml")
        make_run(new / str(k), [f"seed={k}", "+optimized_metric=null"], [0.5, 0.9], [1.0, 0.5], 0.9)
        filled_in(new / str(k), {"optimized_metric": "val/acc", "data": {"vocabulary": 257 + (k == 2)}})
    assert compare_runs.main([str(old)]) == 0
    out = capsys.readouterr().out
    assert [row[1:3] for row in table_rows(out)] == [["`(all runs)`", "3"]]
    assert (
        "3 runs recorded before .hydra/filled_in.yaml (0, 1, 2): optimized_metric, data.vocabulary, data.num_classes, "
        "task.num_classes (keys a run may fill in itself) not compared"
    ) in out.splitlines()
    assert compare_runs.main([str(new)]) == 0
    out = capsys.readouterr().out
    assert [row[1:3] for row in table_rows(out)] == [["`(all runs)`", "3"]]
    assert (
        "filled in by the runs, not settings: data.vocabulary: 257 (0 1), 258 (2); optimized_metric=val/acc"
    ) in out.splitlines()
    for a, b in ((old / "0", old / "1"), (new / "0", new / "1")):
        assert compare_runs.main(["--diff", str(a), str(b)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[3:6] == ["config: 1 key differs (.hydra/config.yaml, resolved: what was set)", *lines[4:6]]
        assert [line.split() for line in lines[4:6]] == [["key", "A", "B"], ["seed", "0", "1"]]
    assert lines[6] == "filled in by the run, not settings: data.vocabulary=257, optimized_metric=val/acc"


def test_runs_of_other_code_are_settings_apart_unless_pooled_and_a_repeated_seed_is_named(tmp_path, capsys):
    """Runs at two commits and one with uncommitted changes, seed 0 three times: split by code, or pooled with
    --pool-code and said; a run continued across commits is mixed code; a run without provenance is unknown code."""
    root = tmp_path / "runs"
    for job, (seed, commit, diff) in enumerate([(0, "a", None), (0, "a", None), (1, "b", None), (0, "a", "+x\n")]):
        make_run(root / str(job), [f"seed={seed}"], [0.5, 0.9 + job / 100], [1.0, 0.5], 0.9)
        provenance(root / str(job), commit * 40, {"torch": "2.4.0"}, diff=diff)
    assert compare_runs.main([str(root)]) == 0
    out = capsys.readouterr().out
    digest = hashlib.sha256(b"+x\n").hexdigest()[:7]
    assert [(row[1], row[2]) for row in table_rows(out)] == [
        (f"`code=aaaaaaa+diff {digest}`", "1"),
        ("`code=bbbbbbb`", "1"),
        ("`code=aaaaaaa`", "2"),
    ]
    assert "setting 3: seed=0 repeats in runs 0, 1: they are not independent samples" in out.splitlines()
    assert compare_runs.main([str(root), "--pool-code"]) == 0
    out = capsys.readouterr().out
    assert [row[1:3] for row in table_rows(out)] == [["`(all runs)`", "4"]]
    assert "runs of other code pooled (--pool-code)" in out
    assert (
        f"setting 1 pools 3 code versions (--pool-code): aaaaaaa (0, 1); bbbbbbb (2); aaaaaaa+diff {digest} (3)"
    ) in out
    assert "setting 1: seed=0 repeats in runs 0, 1, 3: they are not independent samples" in out

    (root / "2" / "provenance_parts" / "1").mkdir(parents=True)  # job 2 began at commit a, continued at b
    provenance(root / "2" / "provenance_parts" / "1", "a" * 40, {"torch": "2.4.0"})
    (root / "3" / "provenance.json").unlink()
    assert compare_runs.main([str(root)]) == 0
    out = capsys.readouterr().out
    assert ("`code=aaaaaaa, then bbbbbbb`", "1") in [(row[1], row[2]) for row in table_rows(out)]
    assert "mixed code: 2 was continued across code versions (aaaaaaa, then bbbbbbb)" in out
    assert (
        "code versions unknown for 3 (no provenance.json, or no commit in it): the table cannot tell whether they "
        "ran the same code"
    ) in out


def test_every_run_named_or_found_is_averaged_or_said_why_not(sweep, capsys, monkeypatch, tmp_path):
    """A run named on the command line that failed before its first epoch (.hydra/, no metrics.jsonl) is listed."""
    (sweep / "8" / ".hydra").mkdir(parents=True)
    shutil.copy(sweep / "0" / ".hydra" / "config.yaml", sweep / "8" / ".hydra" / "config.yaml")
    monkeypatch.chdir(tmp_path)  # several PATHs: the curves go to ./compare
    assert compare_runs.main([str(sweep / "0"), str(sweep / "6"), str(sweep / "7"), str(sweep / "8")]) == 0
    out = capsys.readouterr().out
    assert [row[1:3] for row in table_rows(out)] == [["`(all runs)`", "1"]]
    assert out.splitlines()[-3:] == [
        "not averaged: 6: unfinished (stopped, failed or still running): no summary.json",
        "not averaged: 7: diverged: summary.json's stop_reason is non-finite loss",
        "not averaged: 8: failed before its first epoch (or is still starting): no metrics.jsonl",
    ]
    (sweep / "9" / ".hydra").mkdir(parents=True)  # found below PATH: eval.py's record is no run
    (sweep / "9" / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    name: eval\n")
    assert compare_runs.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "not averaged: 8: failed before its first epoch (or is still starting): no metrics.jsonl" in out
    assert "not averaged: 9" not in out


def test_a_metric_no_run_has_is_refused_naming_theirs(sweep, capsys):
    assert compare_runs.main([str(sweep), "--metric", "val/f1"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "error: --metric val/f1: no finished run here has it; theirs are val/acc, test/loss, test/acc, val/loss, "
        "wall_seconds"
    ]
    assert not (sweep / "compare").exists()


def test_an_interval_is_clipped_to_the_range_its_task_records_with_a_footnote(tmp_path, capsys):
    ranges = {"acc": [0, 1], "loss": [0, None]}
    for k, (acc, wall) in enumerate([(0.98, 1.0), (1.0, 1.0), (1.0, 30.0)]):
        make_run(tmp_path / str(k), [f"seed={k}"], [0.5, acc], [1.0, 0.5], acc, metric_ranges=ranges, wall_seconds=wall)
    assert compare_runs.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (row,) = table_rows(out)
    assert row[3] == "0.9933 ± 0.0115 [0.9646, 1.0000]†"  # the t-interval's high is 1.0220
    assert row[7] == "10.7 ± 16.7 [0.0, 52.3]†"  # its low: -30.8
    assert (
        "† interval clipped to the metric's range (val/acc in [0, 1]; test/acc in [0, 1]; wall s >= 0; the task's, "
        "as summary.json records it): the t-interval itself runs past it"
    ) in out.splitlines()


def test_the_default_out_with_several_paths_is_the_current_folder_and_its_path_is_printed(
    sweep, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert compare_runs.main([str(sweep / "0"), str(sweep / "3")]) == 0
    assert f"curves in {tmp_path / 'compare'}: train_loss.png, val_acc.png, val_loss.png" in capsys.readouterr().out
    assert (tmp_path / "compare" / "val_acc.png").is_file() and not (sweep / "0" / "compare").exists()


def test_folds_use_the_corrected_resampled_t_and_shared_folds_a_paired_difference(tmp_path, capsys):
    """5 folds of two settings: the interval is mean +- t(0.975, 4) * std * sqrt(1/5 + n_val/n_train) with the split
    sizes each run recorded (Nadeau and Bengio 2003), or 1/(k-1) without; the folds pair the settings."""
    for fold, acc in enumerate([0.80, 0.82, 0.84, 0.86, 0.88]):
        for lr, shift in ((0.1, 0.0), (0.03, -0.01 - fold / 1000)):
            overrides = ["+data.folds=5", f"+data.fold={fold}", f"optimizer.lr={lr}"]
            sizes = {"train": 90, "val": 10} if lr == 0.1 else {}
            make_run(tmp_path / f"{lr}-{fold}", overrides, [0.5, acc + shift], [1, 0.5], 0.8, split_sizes=sizes)
    assert compare_runs.main([str(tmp_path)]) == 0
    rows = table_rows(capsys.readouterr().out)
    half = 2.7764 * 0.031623 * (1 / 5 + 10 / 90) ** 0.5  # 0.0490; a plain t: 0.0393
    low, high = (float(x) for x in rows[0][3].split("[")[1].rstrip("]").split(", "))
    assert (low, high) == pytest.approx((0.84 - half, 0.84 + half), abs=1e-4)
    assert rows[0][-3] == "corrected t (folds; n_val/n_train 0.111, recorded)"
    assert rows[1][-3] == "corrected t (folds; 1/(k-1) for k=5: split sizes not recorded)"
    assert rows[1][3] == "0.8280 ± 0.0300 [0.7720, 0.8840]"  # 2.7764 * 0.030042 * sqrt(1/5 + 1/4) = 0.0560
    # Each fold of lr=0.03 is 0.010 to 0.014 below the same fold of lr=0.1: the differences' std is 0.0015811, and
    # 2.7764 * 0.0015811 * sqrt(1/5 + 10/90) = 0.0024 (the best's folds: their recorded sizes).
    assert rows[1][-2:] == ["-0.0120 [-0.0144, -0.0096] (n=5)", "worse"]


def test_compare_runs_reads_the_data_each_run_recorded(tmp_path, capsys):
    """summary.json's data decides where both runs record it: folds of one dataset (and a copy of it elsewhere, another
    data.root) are one comparison; other files under one data.path are refused; runs from before it was recorded
    fall back to the config's data keys."""
    data = {"option": "my_project.Reviews", "classes": ["neg", "pos"], "rows": 80,
            "files": {"reviews.jsonl": {"bytes": 4829, "sha256": "a" * 64}}}  # fmt: skip
    for fold in range(2):
        make_run(tmp_path / "folds" / str(fold), [f"data.fold={fold}"], [0.5], [1.0], 0.5, data=data)
    make_run(tmp_path / "folds" / "2", ["data.fold=2", "data.root=/elsewhere"], [0.5], [1.0], 0.5, data=data)
    assert compare_runs.main([str(tmp_path / "folds")]) == 0
    capsys.readouterr()
    other = {**data, "files": {"reviews.jsonl": {"bytes": 4829, "sha256": "b" * 64}}}
    make_run(tmp_path / "folds" / "3", ["data.fold=3"], [0.5], [1.0], 0.5, data=other)
    assert compare_runs.main([str(tmp_path / "folds")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: 0 and 3 are runs of different tasks or data (3's data against 0's: the contents of reviews.jsonl "
        "differ (the same name and size; sha256 bbbbbbbbbbbb, was aaaaaaaaaaaa)): their metrics do not compare; give "
        "compare_runs.py the runs of one task and data"
    ]
    make_run(tmp_path / "older" / "0", ["data.fold=0"], [0.5], [1.0], 0.5)  # from before: no data recorded
    make_run(tmp_path / "older" / "1", ["data.fold=1", "data.root=/elsewhere"], [0.5], [1.0], 0.5, data=data)
    assert compare_runs.main([str(tmp_path / "older")]) == 1
    assert "(data.root=None vs /elsewhere)" in capsys.readouterr().err


def test_diff_names_the_data_two_runs_read_and_a_comparison_of_them_is_refused(tmp_path, capsys):
    """Without checkpoints --diff reads summary.json's data: files of one name and size with other contents are
    named, and the runs are not compared."""
    data = {"option": "my_project.Reviews", "classes": ["neg", "pos"], "rows": 80,
            "files": {"reviews.jsonl": {"bytes": 4829, "sha256": "a" * 64}}}  # fmt: skip
    other = {**data, "files": {"reviews.jsonl": {"bytes": 4829, "sha256": "b" * 64}}}
    make_run(tmp_path / "a", [], [0.5], [1.0], 0.5, data=data)
    make_run(tmp_path / "b", [], [0.5], [1.0], 0.5, data=other)
    contents = "the contents of reviews.jsonl differ (the same name and size; sha256 bbbbbbbbbbbb, was aaaaaaaaaaaa)"
    assert compare_runs.main(["--diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data:")]
    assert line.startswith(f"data: B's differs from A's: {contents}") and line.endswith("(summary.json, summary.json)")
    assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: a and b are runs of different tasks or data (b's data against a's: {contents}): their metrics do "
        "not compare; give compare_runs.py the runs of one task and data"
    ]
