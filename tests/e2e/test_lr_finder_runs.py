"""The LR finder (lr_finder.enabled) in train.py's runs: before training, its suggestion the LR trained with, on
every kind of data and task (images, a language model; classified text: test_text_classification.py; a Hugging Face
model: test_hf.py; a segmentation: test_segmentation.py).
The range test itself: tests/unit/tuning/test_lr_finder.py."""

import re

import pytest
import torch
from PIL import Image
from test_wiring import SHORT_RUN

from helpers import record_run
from trainkit.tuning import lr_finder
from trainkit.tuning.lr_finder import LRFinderResult


@pytest.mark.slow  # trains in this process (run_train)
def test_lr_finder_runs_before_training(run_train):
    # (the batch-size finder's own run, whose batch of 128 this test also checked: test_batch_size_finder.py)
    run = run_train(
        "debug=fast",
        "lr_finder.enabled=true",
        "lr_finder.apply=true",
        "lr_finder.num_steps=20",
        "scheduler=constant",
    )
    with Image.open(run.run_dir / "lr_finder.png") as plot:
        assert plot.format == "PNG" and min(plot.size) > 100
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    # The suggestion is logged with 3 significant digits; the schedule (constant, no warmup) must
    # train at exactly one LR, the suggestion, in every epoch and as the scheduler's base LR.
    suggested = re.findall(r"suggested lr ([0-9.]+e[+-][0-9]+)", run.stderr + run.stdout)
    assert len(suggested) == 1, "no suggestion logged"
    lrs = {m["lr"] for m in run.epoch_metrics()}
    assert len(lrs) == 1
    lr = lrs.pop()
    assert f"{lr:.2e}" == suggested[0]
    assert checkpoint["scheduler"]["base_lrs"] == [lr] * len(checkpoint["optimizer"]["param_groups"])


def test_an_applied_lr_finder_suggestion_is_the_lr_trained_with(tmp_path, monkeypatch):
    """The range test itself is tested in tests/unit/tuning/test_lr_finder.py; here its answer is fixed."""
    monkeypatch.setattr(
        lr_finder, "lr_range_test", lambda *args, **settings: LRFinderResult([0.0123], [1.0], [1.0], 0.0123)
    )
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "lr_finder.enabled=true", "lr_finder.apply=true")
    assert [lrs[0] for lrs in recording.lrs] == pytest.approx([0.0123] * 3)


@pytest.mark.cuda  # scripts/gpu_check.sh
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_lr_finder_runs_on_a_gpu(run_train):
    # (the batch-size finder on a GPU: scripts/gpu_checks/batch_size_finder.sh)
    run = run_train("device=cuda", "trainer.max_epochs=2", "trainer.progress_bar=false", "lr_finder.enabled=true")
    assert run.summary["device"].startswith("cuda") and (run.run_dir / "lr_finder.png").is_file()
    assert "suggested lr" in (run.run_dir / "train.log").read_text()
