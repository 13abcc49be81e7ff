"""scripts/plot_runs.py on hand-made run directories: ranking, overrides, failed runs, the PNG."""

import importlib.util
import json

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("plot_runs", ROOT / "scripts" / "plot_runs.py")
plot_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_runs)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(path, overrides, val_acc, val_loss, test_acc=None, summary=True, metric="val/acc"):
    """A run directory as train.py leaves it: per-epoch and per-step rows, then test metrics."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
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
        best_metrics = {"epoch": best, "val/acc": val_acc[best], "val/loss": val_loss[best]}
        (path / "summary.json").write_text(
            json.dumps(
                {
                    "best": best_metrics,
                    "final": {"val/acc": val_acc[-1]},
                    "test": {"test/acc": test_acc, "test/loss": 0.5},
                    "optimized_metric": metric,
                    "optimized_value": best_metrics[metric],
                    "higher_is_better": {"loss": False, "acc": True},  # the task's direction, as train.py records it
                    "epochs": len(val_acc),
                    "wall_seconds": 12.34,
                    "stop_reason": "max_epochs",
                }
            )
        )


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    make_run(root / "0", ["optimizer.lr=0.1", "debug=fast"], [0.5, 0.6], [1.0, 0.9], test_acc=0.55)
    make_run(root / "1", ["optimizer.lr=0.03000000001234", "debug=fast"], [0.7, 0.9], [0.8, 0.3], test_acc=0.88)
    make_run(root / "2", ["optimizer.lr=10.0", "debug=fast"], [0.1], [float("nan")], summary=False)
    make_run(root / "10", ["optimizer.lr=0.01", "debug=fast"], [0.4, 0.8, 0.85], [1.2, 0.5, 0.4], test_acc=0.8)
    return root


def table_rows(text):
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not line.startswith("|---") and "rank" not in line
    ]


def test_ranks_runs_by_the_optimized_metric_and_writes_a_png(sweep, capsys):
    assert plot_runs.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["1", "10", "0", "2 (no summary.json: failed or running)"]
    assert [r[0] for r in rows] == ["1", "2", "3", "-"]
    assert rows[0][2:6] == ["0.9000", "0.8800", "2", "12.3"]  # val/acc, test/acc, epochs, wall s
    assert rows[0][6] == "`optimizer.lr=0.03`"  # only what differs, Optuna's long floats shortened
    assert "All runs: `debug=fast`" in out
    assert (sweep / "runs.png").read_bytes()[:8] == PNG_MAGIC


def test_a_loss_metric_ranks_lowest_first(sweep, tmp_path, capsys):
    out_png = tmp_path / "plots" / "loss.png"
    assert plot_runs.main([str(sweep), "--metric", "val/loss", "--out", str(out_png)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [r[1] for r in rows][:3] == ["1", "10", "0"] and rows[0][2] == "0.3000"
    assert out_png.read_bytes()[:8] == PNG_MAGIC


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
        ("val/miou", {"loss": False, "miou": True}, ["1", "2", "0"]),
        ("val/bpb", {"loss": False, "bpb": False}, ["0", "2", "1"]),
    ],
    ids=["segmentation", "language_model"],
)
def test_runs_rank_in_the_direction_their_task_recorded_in_summary_json(tmp_path, capsys, metric, direction, ranked):
    ranked_sweep(tmp_path, metric, [0.3, 0.8, 0.5], direction)
    assert plot_runs.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert [r[1] for r in table_rows(out)] == ranked and err == ""


def test_runs_from_before_the_direction_was_recorded_rank_higher_first_with_a_warning(tmp_path, capsys):
    ranked_sweep(tmp_path, "val/miou", [0.3, 0.8, 0.5], None)
    assert plot_runs.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert [r[1] for r in table_rows(out)] == ["1", "2", "0"]
    assert err.splitlines() == [
        "warning: no summary.json here records whether a higher val/miou is better (runs from before it was "
        "recorded): ranked higher first, as every metric but a loss is by default; if that is wrong, add "
        '"higher_is_better": {"miou": false} to their summary.json'
    ]


def test_test_metric_comes_from_the_test_section(sweep, capsys):
    plot_runs.main([str(sweep), "--metric", "test/acc"])
    out = capsys.readouterr().out
    assert "| rank | run | test/acc | epochs |" in out  # no second test/acc column
    assert [r[1] for r in table_rows(out)][:3] == ["1", "10", "0"]


def test_epoch_curves_skip_step_rows_and_broken_lines(sweep):
    curves = plot_runs.read_metrics(sweep / "0" / "metrics.jsonl")
    assert curves["val/acc"] == {0: 0.5, 1: 0.6} and curves["train/loss"] == {0: 1.1, 1: 1.0}
    assert "train/step_loss" not in curves
    assert plot_runs.read_metrics(sweep / "2" / "metrics.jsonl")["val/acc"] == {0: 0.1}


def test_a_single_run_directory_and_a_path_without_runs(sweep, tmp_path, capsys):
    assert plot_runs.main([str(sweep / "10")]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0][6] == "`optimizer.lr=0.01 debug=fast`"
    (tmp_path / "empty").mkdir()
    assert plot_runs.main([str(tmp_path / "empty")]) == 1
    assert "no run directory" in capsys.readouterr().err


def test_one_epoch_runs_are_drawn_as_markers_on_a_whole_epoch_axis(tmp_path):
    root = tmp_path / "short"
    make_run(root / "0", ["seed=1"], [0.5], [1.0], test_acc=0.5)
    make_run(root / "1", ["seed=2"], [0.6], [0.9], test_acc=0.6)
    runs = [plot_runs.load_run(path, root) for path in plot_runs.find_runs(root)]
    figure = plot_runs.draw(runs, None)
    for ax in figure.axes:
        low, high = ax.get_xlim()
        assert low <= -0.5 and high >= 0.5  # not matplotlib's -0.045..0.045 around a lone epoch 0
        assert [tick for tick in ax.get_xticks() if low <= tick <= high] == [0]  # whole epochs only
        lines = ax.get_lines()
        assert len(lines) == 2 and all(line.get_marker() == "o" and line.get_markersize() >= 5 for line in lines)


def test_several_paths_a_glob_and_symlinked_run_directories_are_compared(sweep, tmp_path, capsys, monkeypatch):
    """Two runs side by side (each named from its PATH), a quoted glob, and a folder of symlinks to runs."""
    out = tmp_path / "ab.png"
    assert plot_runs.main([str(sweep / "0"), str(sweep / "1"), "--out", str(out)]) == 0
    assert [r[1] for r in table_rows(capsys.readouterr().out)] == ["1", "0"] and out.read_bytes()[:8] == PNG_MAGIC
    assert plot_runs.main([str(sweep / "1*"), "--out", str(out)]) == 0  # as a shell leaves a quoted pattern
    assert [r[1] for r in table_rows(capsys.readouterr().out)] == ["1", "10"]
    links = tmp_path / "compare"
    links.mkdir()
    for job in ("0", "10"):
        (links / f"job{job}").symlink_to(sweep / job, target_is_directory=True)
    (links / "loop").symlink_to(links, target_is_directory=True)  # a cycle is walked once
    monkeypatch.chdir(tmp_path)
    assert plot_runs.main([str(links)]) == 0
    assert [r[1] for r in table_rows(capsys.readouterr().out)] == ["job10", "job0"]
    with pytest.raises(SystemExit):  # argparse's one line: the pattern matched nothing
        plot_runs.main([str(tmp_path / "nothing*")])
    assert "nothing*: no such directory (the pattern matched nothing)" in capsys.readouterr().err
