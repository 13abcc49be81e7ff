"""task=segmentation end to end: experiment=shapes_segmentation trains, reports the task's metrics,
and works with what classification has (DDP, an exact resume) and with
torchvision's segmentation models."""

import sys

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import ROOT, composed
from helpers import assert_same_training, nothing_left, record_run, template_has
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.distributed.process_group import ProcessInfo
from trainkit.models import build_model
from trainkit.tracking.loggers import Loggers

# A few hundred small images: seconds a run, enough for the U-Net to learn something in 2 epochs.
SMALL = [
    "experiment=shapes_segmentation",
    "data.num_samples=192",
    "data.val_samples=48",
    "data.test_samples=64",
    "data.image_size=16",
    "model.widths=[8,16]",
    "trainer.progress_bar=false",
    "print_config=false",
]


def test_a_short_segmentation_run_reports_the_task_metrics_of_its_best_weights(run_train):
    # min_delta=100: epoch 0 stays the best (val/loss never improves by 100), so best.pt is not the last
    # epoch's weights, and testing those instead of best.pt's shows below. tta_flip (where a trim kept it): each
    # test image's class map is the mean of its own and its mirror's, mirrored back.
    flip = template_has("trainer.tta_flip")
    best_epoch_first = ["regularization.early_stopping.min_delta=100", *["trainer.tta_flip=true"] * flip]
    run = run_train(*SMALL, "trainer.max_epochs=3", "data.batch_size=8", *best_epoch_first)
    summary = run.summary
    assert set(summary["test"]) == {"test/loss", "test/miou", "test/pixel_acc"}
    assert summary["optimized_metric"] == "val/miou" and summary["optimized_value"] == summary["best"]["val/miou"]
    assert "val/miou" in run.stdout + run.stderr  # the epoch line names the task's metrics
    assert summary["best"]["epoch"] == 0 and summary["epochs"] == 3 and summary["test_weights"] == "best"

    # The summary's test metrics, computed here from best.pt's weights without the task's code.
    state = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)
    last = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (state["epoch"], last["epoch"]) == (0, 2)
    assert any(not torch.equal(state["model"][name], value) for name, value in last["model"].items())
    cfg = OmegaConf.create(state["config"])
    data = build_data(cfg.data, device=torch.device("cpu"), seed=cfg.seed)
    model = build_model(cfg.model)
    model.load_state_dict(state["model"])
    images, masks = (torch.cat(part) for part in zip(*data.test))
    mean, std = (torch.tensor(values).view(1, -1, 1, 1) for values in (data.mean, data.std))
    normalized = (images.float() - mean) / std
    with torch.no_grad():
        logits = model.eval()(normalized)
        if flip:
            logits = (logits + model(normalized.flip(-1)).flip(-1)) / 2  # the mirror's, mirrored back
    predicted = logits.argmax(dim=1)
    unions = [((predicted == k) | (masks == k)).sum().item() for k in range(4)]
    ious = [((predicted == k) & (masks == k)).sum().item() / union for k, union in enumerate(unions) if union]
    test = summary["test"]
    assert test["test/miou"] == pytest.approx(sum(ious) / len(ious), abs=1e-6)
    assert test["test/pixel_acc"] == pytest.approx((predicted == masks).float().mean().item(), abs=1e-6)
    per_image = F.cross_entropy(logits, masks, reduction="none").flatten(1).mean(dim=1)
    assert test["test/loss"] == pytest.approx(per_image.mean().item(), rel=1e-5)
    untrained = build_model(cfg.model)
    with torch.no_grad():
        untrained_loss = F.cross_entropy(untrained.eval()((images.float() - mean) / std), masks).item()
    assert test["test/loss"] < 0.8 * untrained_loss  # it learned


def test_each_training_mask_moves_with_its_image(tmp_path, monkeypatch):
    """What reaches the model and the loss in training: each image shifted and maybe mirrored by the task's
    augmentation, its mask moved the same way. Each trained-on image is its training-split image moved by
    one of the 2 x 5 x 5 flips and shifts (up to 2 pixels: crop_padding 0.125 of 16); its mask must be the
    split's mask moved by that same one. A mask left in place, or moved otherwise, fails."""
    overrides = (*SMALL, "data.batch_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=2")
    recording = record_run(tmp_path, monkeypatch, *overrides, "trainer.limit_val_batches=1")
    split_images, split_masks = (torch.cat(part) for part in zip(*recording.run.data.train))

    def moved(x: torch.Tensor, flip: bool, down: int, right: int) -> torch.Tensor:
        """x [..., H, W] shifted by (down, right) pixels, zeros coming in, then mirrored if `flip`."""
        height, width = x.shape[-2:]
        shifted = F.pad(x, (2, 2, 2, 2))[..., 2 - down : 2 - down + height, 2 - right : 2 - right + width]
        return shifted.flip(-1) if flip else shifted

    moves = [(flip, down, right) for flip in (False, True) for down in range(-2, 3) for right in range(-2, 3)]
    found = []  # each trained-on sample's move
    for (raw, normalized), forward, (_, masks, _) in zip(
        recording.transformed, recording.training_forwards(), recording.losses
    ):
        for image, before, after, mask in zip(raw, normalized, forward.inputs, masks):
            [index] = [i for i, split_image in enumerate(split_images) if torch.equal(split_image, image)]
            [move] = [move for move in moves if torch.allclose(moved(before, *move), after)]
            assert torch.equal(mask, moved(split_masks[index], *move)), (index, move)
            found.append(move)
    assert len(found) == 32  # 2 batches of 16
    assert any(flip for flip, _, _ in found) and any(move[1:] != (0, 0) for move in found)  # really moved


@pytest.mark.slow
def test_segmentation_under_ddp_resumes_exactly(run_train):  # the LR finder on it: below
    # a constant LR: the first run's schedule, sized for 1 epoch, is then the straight run's first epoch
    ddp = [
        "distributed=ddp",
        "distributed.nproc_per_node=2",
        "scheduler=constant",
        "regularization.early_stopping.enabled=false",
    ]
    straight = run_train(*SMALL, *ddp, "trainer.max_epochs=2")
    assert straight.summary["world_size"] == 2
    first = run_train(*SMALL, *ddp, "trainer.max_epochs=1")
    resumed = run_train(f"resume={first.run_dir}", *ddp[:2], "trainer.max_epochs=2", run_dir=first.run_dir)
    assert_same_training(resumed, straight)


@pytest.mark.slow  # about 20-60 s on 2 busy CPU cores: the dilated depthwise convolutions train slowly there
def test_a_torchvision_segmentation_model_trains_on_the_shapes(tmp_path):
    sys.path.insert(0, str(ROOT))
    import train

    cfg = composed(
        "experiment=shapes_segmentation",
        "model=torchvision_segmentation",
        "model.name=lraspp_mobilenet_v3_large",
        "data.num_samples=16",
        "data.val_samples=8",
        "data.test_samples=8",
        "data.image_size=16",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.progress_bar=false",
    )
    validate(cfg)
    summary = train.train(cfg, tmp_path, ProcessInfo(), torch.device("cpu"))  # in-process: one rank
    assert summary["steps"] == 2
    assert set(summary["test"]) == {"test/loss", "test/miou", "test/pixel_acc"}
    state = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    statistics = [value for name, value in state["model"].items() if name.endswith("running_mean")]
    assert statistics and any(value.abs().sum() > 0 for value in statistics)  # trained: BatchNorm saw the shapes
    assert any(name.startswith("model.classifier.") for name in state["model"])  # the wrapper's weights


@pytest.mark.slow  # trains two epochs
@pytest.mark.skipif(not template_has("logger.log_predictions"), reason="this clone has no logged_images (trimmed)")
def test_each_validation_hands_the_trackers_the_images_with_true_and_predicted_masks(tmp_path, monkeypatch):
    """What logger.log_predictions sends every tracker, seen without one (W&B's test draws them)."""
    sys.path.insert(0, str(ROOT))
    import train

    sent = []
    monkeypatch.setattr(Loggers, "log_masks", lambda self, *arguments: sent.append(arguments))
    shown = ("logger.log_predictions=3", "data.batch_size=8")  # no tracker: the key alone turns them on
    cfg = composed(*SMALL, *shown, "trainer.max_epochs=2", "trainer.limit_train_batches=2")
    validate(cfg)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train.train(cfg, run_dir, ProcessInfo(), torch.device("cpu"))  # in-process: one rank
    assert [(key, step) for key, *_, step in sent] == [("val/predictions", 2), ("val/predictions", 4)]
    for _, images, true_masks, predicted_masks, class_names, _ in sent:  # 3 images after each of 2 validations
        assert images.shape == (3, 128, 128, 3) and true_masks.shape == predicted_masks.shape == (3, 128, 128)
        assert class_names == ["background", "circle", "square", "triangle"]  # the experiment's task.class_names


@pytest.mark.slow
@pytest.mark.skipif(not template_has("lr_finder"), reason="this clone has no LR finder (trimmed)")
def test_the_lr_finder_runs_on_a_segmentation(run_train):
    finder = run_train(*SMALL, "trainer.max_epochs=1", "lr_finder.enabled=true", "lr_finder.num_steps=8")
    assert (finder.run_dir / "lr_finder.png").is_file() and "lr range test: 8 steps" in finder.stdout + finder.stderr


def test_early_stopping_watches_the_loss_and_the_sweeper_the_iou():
    segmentation = composed("experiment=shapes_segmentation", "optimized_metric=null")
    validate(segmentation)  # its monitored_metric: the loss, its headline the IoU
    stopping = segmentation.regularization.early_stopping
    assert (stopping.monitor, segmentation.optimized_metric) == ("val/loss", "val/miou")
    assert segmentation.regularization.early_stopping.mode == "min"


def test_a_size_the_unet_cannot_halve_is_one_line_before_any_work(run_train):
    """Found by the config check, not by UNet.forward's ValueError; Hydra's run directory is gone again."""
    run = run_train("experiment=shapes_segmentation", "data.image_size=30", check=False)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert nothing_left(run.run_dir, nor_beside=True)
    [line] = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert all(fragment in line for fragment in ("data.image_size", "divisible by 4", "28 or 32")), line
