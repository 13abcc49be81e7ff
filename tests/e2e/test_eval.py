"""eval.py end to end: a checkpoint evaluated as `python eval.py` would, judged by what it writes.

The tests that train share one short classification run on digits, made once for the module and
marked slow (a segmentation's, tested with flip TTA: test_segmentation_eval.py; EMA's weights:
test_ema.py). The bad-input tests need a checkpoint, not a trained one: theirs is written here, untrained, in a run
directory as train.py leaves it.
"""

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, TrainRun, composed, run_here, torchrun
from helpers import nothing_left, template_has
from trainkit.checkpointing import save_checkpoint
from trainkit.config import to_dict
from trainkit.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # the runs in this process: all but eval.py's under DDP

CLASSIFICATION = ("trainer.max_epochs=2",)  # 40 updates: about 0.95 test accuracy


def run_script(script: str, *args: str, timeout: int = 300) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python <script> <args>`: in this process, except DDP runs, whose
    `distributed.nproc_per_node=N` processes torchrun starts."""
    if "distributed=ddp" not in args:
        return run_here(script, *args)
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    processes = [int(arg.split("=", 1)[1]) for arg in args if arg.startswith("distributed.nproc_per_node=")]
    command = [*torchrun(processes[-1]), str(ROOT / script), *args]
    process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return process.returncode, process.stdout, process.stderr


def train(run_dir: Path, *overrides: str) -> TrainRun:
    returncode, stdout, stderr = run_script(
        "train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *overrides
    )
    assert returncode == 0, stderr[-4000:]
    return TrainRun(returncode, stdout, stderr, run_dir)


class Evaluation:
    """One `python eval.py ...` and its output directory."""

    def __init__(self, out_dir: Path, *overrides: str):
        self.out_dir = out_dir
        self.returncode, self.stdout, self.stderr = run_script("eval.py", f"hydra.run.dir={out_dir}", *overrides)

    @property
    def metrics(self) -> dict:
        assert self.returncode == 0, self.stderr[-4000:]
        return json.loads((self.out_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def classification(tmp_path_factory) -> TrainRun:
    return train(tmp_path_factory.mktemp("classification") / "run", *CLASSIFICATION)


@pytest.fixture(scope="module")
def classification_eval(classification, tmp_path_factory) -> Evaluation:
    return Evaluation(tmp_path_factory.mktemp("eval") / "out", f"checkpoint={classification.run_dir}")


@pytest.mark.slow  # trains (once for the module)
def test_eval_gives_exactly_the_runs_test_metrics(classification, classification_eval):
    metrics, summary = classification_eval.metrics, classification.summary
    assert {key: metrics[key] for key in summary["test"]} == summary["test"]  # float equality, not approx
    assert metrics["run_summary_test"] == summary["test"]
    assert metrics["weights"] == "model" and metrics["samples"] == 359 and metrics["split"] == "test"
    assert metrics["checkpoint"] == str((classification.run_dir / "checkpoints" / "best.pt").resolve())
    line = f"test/acc {metrics['test/acc']:.4f} test/loss {metrics['test/loss']:.4f} on 359 samples"
    expected = rf"{re.escape(line)} \(checkpoints/best\.pt of {re.escape(str(classification.run_dir.resolve()))}\)"
    assert re.search(rf"{expected} -> {re.escape(str(classification_eval.out_dir))}$", classification_eval.stdout, re.M)


@pytest.mark.slow  # trains (once for the module)
def test_the_validation_split_gives_the_best_epochs_metrics(classification, tmp_path):
    metrics = Evaluation(tmp_path / "val", f"checkpoint={classification.run_dir}", "split=val").metrics
    best = classification.summary["best"]
    assert {key: metrics[key] for key in ("val/loss", "val/acc")} == {key: best[key] for key in ("val/loss", "val/acc")}


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory) -> Path:
    return write_untrained_run(tmp_path_factory.mktemp("untrained") / "run")


def write_untrained_run(run_dir: Path) -> Path:
    """A run directory with checkpoints/last.pt of the default config and an untrained model."""
    (run_dir / ".hydra").mkdir(parents=True)
    config = to_dict(composed())
    model = build_model(config["model"])
    state = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 20}
    save_checkpoint(run_dir / "checkpoints" / "last.pt", {**state, "batches_done": 0, "config": config})
    return run_dir


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["checkpoint=/no/such/run"], "checkpoint"),
        (["checkpoint={tmp}/foreign.pt"], "checkpoint"),
        (["checkpoint={run}", "predict=/no/such/folder"], "predict"),
        (["checkpoint={run}", "predict={tmp}"], "predict"),  # a folder without images
        (["checkpoint={run}", "data.channels=3"], "data.channels"),  # 3 channels for a model of 1
        (["checkpoint={run}", "data.num_classes=5"], "data.num_classes"),
        (["checkpoint={run}", "data=digits"], "data"),  # the run's data, model and task are its own
        (["checkpoint={run}", "resume={run}"], "resume"),
    ],
    ids=["no such path", "foreign", "no such folder", "no images", "channels", "classes", "data=", "resume"],
)
def test_bad_input_is_one_line_naming_the_key(untrained_run, tmp_path, overrides, key):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    given = [o.format(run=untrained_run, tmp=tmp_path) for o in overrides]
    evaluation = Evaluation(tmp_path / "out", *given)
    assert evaluation.returncode == 1
    lines = evaluation.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: "), evaluation.stderr
    assert nothing_left(tmp_path / "out")  # a refused call leaves no output directory behind


def test_a_run_without_best_pt_is_evaluated_from_its_last_pt(untrained_run, tmp_path):
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_run}")
    metrics = evaluation.metrics
    assert metrics["samples"] == 359 and metrics["run_summary_test"] is None and metrics["weights"] == "model"
    assert metrics["checkpoint"] == str((untrained_run / "checkpoints" / "last.pt").resolve())
    assert f"(checkpoints/last.pt of {untrained_run.resolve()})" in evaluation.stdout


def test_a_run_directory_is_evaluated_from_its_best_pt_not_its_last_pt(untrained_run, tmp_path):
    # train.py tested best.pt's weights; a run directory's last.pt may hold later, worse ones. Here best.pt
    # holds other (zeroed) weights than last.pt: the metrics are best.pt's, and the output names it.
    run_dir = tmp_path / "run"
    shutil.copytree(untrained_run, run_dir)
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    state["model"] = {name: torch.zeros_like(tensor) for name, tensor in state["model"].items()}
    save_checkpoint(run_dir / "checkpoints" / "best.pt", state)  # zero weights: every class equally likely
    metrics = Evaluation(tmp_path / "out", f"checkpoint={run_dir}").metrics
    assert metrics["checkpoint"] == str((run_dir / "checkpoints" / "best.pt").resolve())
    assert metrics["test/loss"] == pytest.approx(math.log(10), rel=1e-6)  # uniform over 10 classes: log 10


@pytest.mark.slow
def test_two_ddp_processes_give_the_same_metrics(classification_eval, classification, tmp_path):
    ddp = Evaluation(
        tmp_path / "ddp", f"checkpoint={classification.run_dir}", "distributed=ddp", "distributed.nproc_per_node=2"
    )
    single, metrics = classification_eval.metrics, ddp.metrics
    assert metrics["world_size"] == 2 and metrics["samples"] == single["samples"]
    assert metrics["test/acc"] == single["test/acc"]  # a count over a count: exact
    assert metrics["test/loss"] == pytest.approx(single["test/loss"], rel=1e-6)  # float32 sums in another order
    written = sorted(path.name for path in (tmp_path / "ddp").iterdir() if path.is_file())
    pictures = ("confusion_matrix.json", "confusion_matrix.png")  # the figures' (tests/e2e/test_eval_figures.py)
    assert [name for name in written if name not in pictures] == ["eval.log", "metrics.json"]


def save_image(path: Path, width: int, height: int) -> None:
    from PIL import Image

    pixels = np.zeros((height, width), np.uint8)
    pixels[height // 4 : height // 2, width // 4 : width // 2] = 255
    Image.fromarray(pixels, mode="L").save(path)


def test_a_sharded_checkpoint_is_one_line_pointing_to_best_pt(untrained_run, tmp_path):
    run_dir = tmp_path / "sharded_run"
    (run_dir / ".hydra").mkdir(parents=True)
    last = run_dir / "checkpoints" / "last"  # as a sharded run leaves it: state.pt beside DCP's shards
    last.mkdir(parents=True)
    state = torch.load(untrained_run / "checkpoints" / "last.pt", weights_only=True)
    torch.save({key: value for key, value in state.items() if key not in ("model", "optimizer")}, last / "state.pt")
    (last / ".metadata").write_bytes(b"")
    save_checkpoint(run_dir / "checkpoints" / "best.pt", state)
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={last}")
    assert evaluation.returncode == 1
    lines = evaluation.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint: {last} is a sharded checkpoint"), lines
    assert f"evaluate {run_dir / 'checkpoints' / 'best.pt'} (its full weights)" in lines[0]


def test_the_validation_split_is_limited_as_the_run_validated(untrained_run, tmp_path):
    limited = ("split=val", "trainer.limit_val_batches=2", "data.eval_batch_size=64")  # 128 of its 180 samples
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_run}", *limited)
    assert evaluation.metrics["samples"] == 128 and evaluation.metrics["limit_val_batches"] == 2
    assert "on 128 samples, a seeded sample of 2 batches per process (trainer.limit_val_batches=2)" in evaluation.stdout
    whole = Evaluation(tmp_path / "test", f"checkpoint={untrained_run}", *limited[1:]).metrics
    assert whole["samples"] == 359 and "limit_val_batches" not in whole  # the test split: whole, as the run tested


@pytest.mark.skipif(not template_has("model/hf.yaml"), reason="this clone has no export= (trimmed with hf)")
def test_an_export_of_data_without_tokens_says_nothing_of_tokens(untrained_run, tmp_path):
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_run}", f"export={tmp_path / 'export'}")
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    said = evaluation.stdout + evaluation.stderr
    assert "exported the tested weights" in said and "token" not in said  # digits: pixels, no tokenizer to speak of
