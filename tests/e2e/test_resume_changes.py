"""End to end: a resume that changes what an epoch is (its batch size, its number of processes) or
finds its run directory taken."""

import os
import shutil
import socket
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TrainRun, run_here
from helpers import has_folds, hashes_of_every_file, needs_image_folders, unchanged_but_the_record
from trainkit.checkpointing import own_run_directory

QUICK = ("trainer.progress_bar=false", "print_config=false", "trainer.log_every_n_steps=1")


# A 4-epoch cosine that early stopping ends after epoch 1 (no improvement can beat min_delta=100): a checkpoint at an
# epoch's end, half-way down the schedule.
STOP_AFTER_EPOCH_1 = (
    "trainer.max_epochs=4",
    "regularization.early_stopping.patience=1",
    "regularization.early_stopping.min_delta=100",
)


@pytest.fixture(scope="module")
def stopped_at_default_batch_size(tmp_path_factory) -> Path:
    """The run directory of STOP_AFTER_EPOCH_1 at the default batch size, trained once for the module."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    run = TrainRun(*run_here("train.py", f"hydra.run.dir={run_dir}", *QUICK, *STOP_AFTER_EPOCH_1), run_dir)
    assert run.returncode == 0, run.stderr[-4000:]
    assert [m["epoch"] for m in run.epoch_metrics()] == [0, 1]
    return run_dir


@pytest.mark.slow  # trains two runs
@pytest.mark.parametrize("batch_size", [32, 128])  # half and double the default 64: 40 and 10 updates an epoch, not 20
def test_a_batch_size_changed_at_an_epoch_end_still_ends_the_schedule_on_the_last_update(
    run_train, batch_size, stopped_at_default_batch_size, tmp_path
):
    # the resume trains epochs 2 and 3 with another batch size, each in its own copy of the stopped run
    run_dir = shutil.copytree(stopped_at_default_batch_size, tmp_path / "stopped")
    resumed = run_train(
        f"resume={run_dir}",
        f"data.batch_size={batch_size}",
        "regularization.early_stopping.enabled=false",
        run_dir=run_dir,
    )
    epochs = resumed.epoch_metrics()
    assert [m["epoch"] for m in epochs] == [0, 1, 2, 3]
    after = [m["lr"] for m in resumed.metrics if "train/step_loss" in m and m["epoch"] >= 2]
    assert len(after) == 2 * {32: 40, 128: 10}[batch_size]
    assert after[-1] == pytest.approx(0.0, abs=1e-12)  # cosine's end (min_lr_ratio 0) on the run's last update
    assert all(lr > 0 for lr in after[:-1]) and after == sorted(after, reverse=True)
    # The curve goes on from where epoch 1 left it: the epochs count, not the updates.
    assert 0.9 * epochs[1]["lr"] < after[0] < epochs[1]["lr"]


def test_a_run_directory_in_use_by_another_run_is_refused_in_one_line(run_train):
    tiny = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1", *QUICK)
    first = run_train(*tiny, "trainer.max_epochs=1")
    metrics = (first.run_dir / "metrics.jsonl").read_text()
    with own_run_directory(first.run_dir, key="resume"):  # as a run training there now holds it
        second = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir, check=False)
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"error: resume: {first.run_dir} is in use by process {os.getpid()} on {socket.gethostname()} (it holds "
        f"{first.run_dir / '.lock'}): another run trains there now; wait for it to end or stop it, then resume"
    )
    assert (first.run_dir / "metrics.jsonl").read_text() == metrics  # nothing trimmed, nothing trained
    again = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir)  # released: it trains
    assert [m["epoch"] for m in again.epoch_metrics()] == [0, 1]


def test_a_new_run_in_a_directory_that_holds_a_run_is_refused_and_leaves_every_file_as_it_was(run_train):
    first = run_train("debug=fast", *QUICK)
    before, epochs = hashes_of_every_file(first.run_dir), [m["epoch"] for m in first.epoch_metrics()]
    again = run_train("debug=fast", *QUICK, run_dir=first.run_dir, check=False)  # no resume=: it would start over
    assert again.returncode == 1
    assert again.stderr.strip() == (
        f"error: hydra.run.dir: {first.run_dir} holds a run (checkpoints/last.pt, metrics.jsonl, summary.json), and a "
        f"new run there would overwrite its checkpoints and append to its metrics.jsonl; continue it with "
        f"resume={first.run_dir}, or start a new run elsewhere (e.g. hydra.run.dir={first.run_dir}-2)"
    )
    assert unchanged_but_the_record(first.run_dir, before)  # no metrics line appended, no checkpoint overwritten
    shutil.rmtree(first.run_dir / "checkpoints")
    (first.run_dir / "summary.json").unlink()  # a run that logged, then crashed before its first checkpoint
    logged = run_train("debug=fast", *QUICK, run_dir=first.run_dir, check=False)
    assert logged.returncode == 1 and logged.stderr.strip().endswith(
        f"holds a run (metrics.jsonl), and a new run there would overwrite its checkpoints and append to its "
        f"metrics.jsonl; it has no checkpoints/last.pt to resume from: start the new run elsewhere (e.g. "
        f"hydra.run.dir={first.run_dir}-2)"
    )
    (first.run_dir / "metrics.jsonl").unlink()  # Hydra's record and a log alone: nothing to lose, a new run starts
    new = run_train("debug=fast", *QUICK, run_dir=first.run_dir)
    assert [m["epoch"] for m in new.epoch_metrics()] == epochs  # its own lines alone


@needs_image_folders
def test_a_resume_refuses_data_that_changed_since_the_checkpoint(run_train, tmp_path):
    from PIL import Image

    for split, count in (("train", 6), ("val", 2), ("test", 2)):
        for colour in ("red", "blue"):
            (tmp_path / "images" / split / colour).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (12, 12), colour).save(tmp_path / "images" / split / colour / f"{i}.png")
    folder = ("data=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8", "data.num_workers=0")
    command = (*folder, *QUICK, "data.batch_size=4", "trainer.max_epochs=1")
    first = run_train(*command)
    # The same command with resume=auto: data.num_classes null (count them) is no change from the 2 counted.
    again = run_train(*command, "resume=auto", run_dir=first.run_dir)
    assert "config as in the checkpoint" in again.stdout and "num_classes" not in again.stdout
    for i in range(6, 9):  # 3 more training images, as a user adds them between two sessions
        Image.new("RGB", (12, 12), "red").save(tmp_path / "images" / "train" / "red" / f"{i}.png")
    resumed = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir, check=False)
    assert resumed.returncode == 1
    assert resumed.stderr.strip() == (
        "error: data: 3 files added to the train split since the checkpoint: the resumed run would train and test "
        "on other splits; resume with the data the run trained on, or start a new run"
    )
    # A new class folder: the model keeps its 2 outputs, so `set data.num_classes=3` is no way out on a resume.
    for split in ("train", "val", "test"):
        (tmp_path / "images" / split / "green").mkdir()
        Image.new("RGB", (12, 12), "green").save(tmp_path / "images" / split / "green" / "0.png")
    new_class = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir, check=False)
    assert new_class.returncode == 1 and new_class.stderr.strip() == (
        "error: data.root: has 3 classes now, the checkpoint's run trained on 2 (a class folder was added or removed): "
        "resume with the folder as it was, or start a new run on the folder as it is"
    )
    # In-memory data (digits): another split_seed puts other samples in each split.
    digits = run_train(*QUICK, "trainer.max_epochs=1", "trainer.limit_train_batches=2")
    carved = run_train(
        f"resume={digits.run_dir}", "data.split_seed=1", "trainer.max_epochs=2", check=False, run_dir=digits.run_dir
    )
    assert carved.returncode == 1 and carved.stderr.strip().startswith(
        "error: data: the train split holds other values (its shape is the same); the val split holds other values"
    )
    if has_folds:  # another fold of k-fold cross-validation: the val split is another part of the pool
        fold = run_train(*QUICK, "trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.folds=3", "data.fold=0")
        other = run_train(
            f"resume={fold.run_dir}", "data.fold=1", "trainer.max_epochs=2", check=False, run_dir=fold.run_dir
        )
        assert other.returncode == 1
        assert other.stderr.strip() == (
            "error: data: the val split is fold 1 of 3 (data.folds, data.fold), was fold 0 of 3 since the checkpoint: "
            "the resumed run would train and test on other splits; resume with the data the run trained on, or start "
            "a new run"
        )
    # The checkpoint carries the wall time of the parts before it: the summary counts them (here 1000 s, made up).
    last = digits.run_dir / "checkpoints" / "last.pt"
    torch.save({**torch.load(last, weights_only=True), "wall_seconds": 1000.0}, last)
    same = run_train(f"resume={digits.run_dir}", "trainer.max_epochs=2", run_dir=digits.run_dir)  # unchanged: resumes
    assert [m["epoch"] for m in same.epoch_metrics()] == [0, 1]
    assert 1000 < same.summary["wall_seconds"] < 1000 + 600


@pytest.mark.slow  # three runs, one of them with 2 DDP processes
def test_another_number_of_processes_is_taken_at_an_epoch_end_and_refused_inside_an_epoch(run_train, monkeypatch):
    # One DDP run writes both checkpoints: rank 0's SIGTERM in the 15th update stops it inside epoch 1 (last.pt),
    # after epoch 0 wrote best.pt at its end.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    ddp = ("distributed=ddp", "distributed.nproc_per_node=2", *QUICK)  # 2 x 629 samples: 10 updates an epoch
    preempting = ("model._target_=models_for_tests.PreemptedCNN", "trainer.max_epochs=3")
    inside = run_train(*ddp, *preempting, "+model.preempt_at=15", check=False)  # stops at epoch 1, batch 5
    assert "stopped by SIGTERM" in inside.stdout + inside.stderr, inside.stderr[-4000:]
    refused = run_train(f"resume={inside.run_dir}", "distributed=none", check=False, run_dir=inside.run_dir)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: distributed.nproc_per_node: this run has 1 process but 2 processes wrote its checkpoint inside "
        "epoch 1 (after batch 5): the batches already trained would be miscounted; resume with 2 processes, or "
        "from an epoch's end"
    )

    alone = run_train(
        f"resume={inside.run_dir / 'checkpoints' / 'best.pt'}",
        "distributed=none",
        "regularization.early_stopping.enabled=false",
        "model.preempt_at=0",  # the checkpoint's config holds it
        run_dir=inside.run_dir,
    )  # one process from epoch 0's end: 20 updates an epoch
    after = [m["lr"] for m in alone.metrics if "train/step_loss" in m and m["epoch"] >= 1]
    assert len(after) == 40 and after[-1] == pytest.approx(0.0, abs=1e-12) and all(lr > 0 for lr in after[:-1])
