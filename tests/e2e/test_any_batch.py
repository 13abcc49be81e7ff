"""Any batch: a batch is whatever the data's loader yields (here a dict, lengths beside values), and the task's
`step` is what it means for training (train.py's train_step, evaluation). Micro-batches of a dict batch update
as the whole batch; a model that returns (logits, aux) trains on the task's auxiliary loss and is scored on its
logits; a data kind whose batches are dicts trains, validates and tests end to end."""

import copy
import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from data_for_tests import signals
from helpers import has_predict, loop_config, needs_file_data, record_run, template_has
from models_for_tests import LengthsNet, WithAuxiliaryOutput
from tasks_for_tests import AuxiliaryLoss, SignalClassification
from trainkit.data import DataBundle
from trainkit.distributed.process_group import ProcessInfo
from trainkit.tasks.evaluation import evaluate

sys.path.insert(0, str(ROOT))
import train

CPU = torch.device("cpu")
LR = 0.5


def make_run(batches: list, task, model, micro_batch_size: int | None = None) -> train.Run:
    cfg = loop_config(1, micro_batch_size)
    run = train.Run(cfg, Path("unused"), ProcessInfo(), CPU)
    run.data = DataBundle(batches, batches, batches, num_classes=10, kind="generic")
    run.model = run.trained_model = model
    run.train_transform = run.eval_transform = torch.nn.Identity()
    run.task = task
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=LR)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    return run


def weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def one_update(batch: dict, micro_batch_size: int | None) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    run = make_run([batch], SignalClassification(num_classes=10), LengthsNet(9, 10), micro_batch_size)
    metrics = train.train_one_epoch(run, show_progress=False)
    assert run.state.step == 1
    return weights(run.model), metrics


def test_micro_batches_of_a_dict_batch_with_lengths_update_as_the_whole_batch():
    batch = signals(12)
    whole, whole_metrics = one_update(batch, None)
    parts, parts_metrics = one_update(batch, 5)  # parts of 5, 5 and 2 signals, each a dict of all three
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-6)
    assert parts_metrics["train/loss"] == pytest.approx(whole_metrics["train/loss"], abs=1e-6)
    assert parts_metrics["train/acc"] == whole_metrics["train/acc"]
    # the update is plain SGD on the mean cross-entropy of the batch, the padding masked by its lengths
    torch.manual_seed(0)
    reference = LengthsNet(9, 10)
    F.cross_entropy(reference(batch["signal"], batch["lengths"]), batch["label"]).backward()
    torch.testing.assert_close(whole, torch.cat([(p - LR * p.grad).flatten() for p in reference.parameters()]))


def test_a_model_returning_logits_and_an_auxiliary_loss_trains_on_the_task_s_loss_and_is_scored_on_its_logits():
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.rand(8, 1, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    torch.manual_seed(0)
    model = WithAuxiliaryOutput(1, 10, widths=(4, 8))
    reference = copy.deepcopy(model)
    run = make_run([(images, labels)], AuxiliaryLoss(num_classes=10, aux_weight=0.5), model, micro_batch_size=3)
    train.train_one_epoch(run, show_progress=False)
    logits, aux = reference(images)
    (F.cross_entropy(logits, labels) + 0.5 * aux).backward()
    expected = torch.cat([(p - LR * p.grad).flatten() for p in reference.parameters()])
    torch.testing.assert_close(weights(run.model), expected, rtol=0, atol=1e-6)

    result = evaluate(run.model, [(images, labels)], torch.nn.Identity(), run.task, "fp32", CPU)
    with torch.no_grad():
        logits, _ = run.model(images)
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), abs=1e-6)  # no aux in val/loss
    assert result["acc"] == (logits.argmax(dim=1) == labels).float().mean().item()


DICT_RUN = (
    "device=cpu",
    "print_config=false",
    "data._target_=file_data_for_tests.DigitSignals",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "~model",
    "+model._target_=models_for_tests.LengthsNet",
    "+model.max_length=64",
    "+model.num_classes=10",
    "~task",
    "+task._target_=tasks_for_tests.SignalClassification",
    "+task.num_classes=10",
    "regularization=none",
    "trainer.max_epochs=2",
    "trainer.micro_batch_size=24",  # batches of 64 in parts of 24, 24 and 16
)


@needs_file_data
def test_a_data_kind_whose_batches_are_dicts_with_lengths_trains_and_is_tested_end_to_end(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *DICT_RUN)
    trained = recording.training_forwards()
    sizes = [len(forward.inputs) for forward in trained]  # the signals, cut into micro-batches
    assert sorted(set(sizes)) == [16, 18, 24] and sum(sizes) == 2 * 1258  # 19 batches of 64 and one of 42, twice
    summary = recording.summary
    assert summary["optimized_metric"] == "val/acc"
    # test/ recomputed here from best.pt, batch by batch over the dicts the test loader yields
    model = LengthsNet(64, 10)
    model.load_state_dict(torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)["model"])
    nats, right, count = 0.0, 0, 0
    with torch.no_grad():
        for batch in recording.run.data.test:
            assert set(batch) == {"signal", "lengths", "label"}
            outputs = model(batch["signal"], batch["lengths"])
            nats += F.cross_entropy(outputs, batch["label"], reduction="sum").item()
            right += (outputs.argmax(dim=1) == batch["label"]).sum().item()
            count += len(batch["label"])
    assert count == 359  # 1797 digits: 359 to test, 180 to validate, 1258 to train
    assert summary["test"]["test/loss"] == pytest.approx(nats / count, rel=1e-5)
    assert summary["test"]["test/acc"] == right / count
    assert summary["test"]["test/acc"] > 0.5  # a chance guess is 0.1: the signals and their lengths were learned


CAPTIONED_RUN = (
    "device=cpu",
    "print_config=false",
    "trainer.progress_bar=false",
    "data._target_=file_data_for_tests.CaptionedDigits",  # {"image", "caption", "targets"}; the digits' image keys
    "~model",
    "+model._target_=models_for_tests.ImageAndCaption",
    "+model.in_channels=1",
    "+model.num_classes=10",
    "task._target_=tasks_for_tests.CaptionedClassification",
    "trainer.max_epochs=2",
    *(["logger.log_images=true"] if template_has("logger.log_images") else []),  # a grid of what the task shows
)


@needs_file_data
@pytest.mark.slow  # trains for two epochs
def test_an_image_and_text_dict_batch_trains_with_tensorboard_and_predict_makes_batches_of_its_form(tmp_path):
    """Before: logger=tensorboard took a dict batch's [0] (KeyError), the image transform took the whole dict
    (AttributeError), and predict= gave the task (images, None) (TypeError: the model's caption missing)."""
    from PIL import Image

    from conftest import run_here
    from models_for_tests import ImageAndCaption
    from trainkit.data.datasets import read_digits

    run_dir = tmp_path / "run"
    tensorboard = ["logger=tensorboard", "logger.log_images=true"] if template_has("logger/tensorboard.yaml") else []
    returncode, _, stderr = run_here("train.py", f"hydra.run.dir={run_dir}", *CAPTIONED_RUN, *tensorboard)
    assert returncode == 0, stderr[-4000:]
    assert bool(list(run_dir.glob("events.out.tfevents.*"))) == bool(tensorboard)
    if template_has("logger.log_images"):
        grid = np.asarray(Image.open(run_dir / "train_samples.png"))
        assert grid.shape == (4 * (32 + 1) + 1, 8 * (32 + 1) + 1, 3)  # the first 32 images, 8x8 enlarged to 32x32
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test"]["test/acc"] > 0.5  # a chance guess is 0.1
    if not has_predict:
        return

    # An import block of its own: where file_data is trimmed, ruff sorts its module into another section.
    from file_data_for_tests import CAPTIONS

    pixels, _ = read_digits()
    images = torch.from_numpy(pixels[:6]).mul(255 / 16).round().to(torch.uint8).reshape(6, 1, 8, 8)
    (tmp_path / "new").mkdir()
    for index, image in enumerate(images):
        Image.fromarray(image[0].numpy()).save(tmp_path / "new" / f"{index}.png")
    out = tmp_path / "out"
    returncode, stdout, stderr = run_here(
        "eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", f"predict={tmp_path / 'new'}"
    )
    assert returncode == 0, stderr[-4000:]
    assert "predictions for 6 images" in stdout
    with (out / "predictions.csv").open() as file:
        rows = list(csv.DictReader(file))
    model = ImageAndCaption(1, 10)
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"])
    with torch.no_grad():  # the batch CaptionedDigits makes of images: each with the caption "a digit"
        logits = model.eval()((images.float() / 255 - 0.305) / 0.376, CAPTIONS[0].expand(6, -1))
    probabilities, classes = logits.softmax(dim=1).max(dim=1)
    assert [row["file"] for row in rows] == [f"{index}.png" for index in range(6)]
    assert [int(row["class"]) for row in rows] == classes.tolist()
    assert [float(row["probability"]) for row in rows] == pytest.approx(probabilities.tolist(), abs=1e-6)
