"""logger.log_predictions in W&B: images with their true and predicted masks, read back from the offline run."""

import numpy as np
import pytest
import test_wandb_logger
import torch
from PIL import Image as PILImage

from tasks_for_tests import PixelClasses
from trainkit.data import TensorLoader
from trainkit.tracking.loggers import build_loggers
from trainkit.tracking.prediction_images import first_images, log_predictions
from wandb_offline import offline_run

wandb = pytest.importorskip("wandb")
quiet_local_wandb, run_dir = test_wandb_logger.quiet_local_wandb, test_wandb_logger.run_dir  # its fixtures
wandb_cfg = test_wandb_logger.wandb_cfg


def test_log_predictions_draws_true_and_predicted_masks_over_fixed_validation_images(run_dir):
    """logger.log_predictions: the first images of the validation loader, each with its true and
    predicted masks and the task's class names, land in the offline run as W&B images with masks."""
    task = PixelClasses(["background", "disc", "bar"])  # a task that draws its class maps, as a segmentation does
    images, masks = torch.rand(6, 1, 8, 8), torch.randint(0, 3, (6, 8, 8))
    shown = first_images(TensorLoader(images, masks, 4, shuffle=False), task, 5, torch.device("cpu"))
    assert torch.equal(shown[0], images[:5]) and torch.equal(shown[1], masks[:5])  # across batches, in order
    loggers = build_loggers(wandb_cfg(), run_dir)
    model = torch.nn.Conv2d(1, 3, kernel_size=1)
    log_predictions(loggers, model, shown, lambda x: x, task, "fp32", torch.device("cpu"), step=7)
    loggers.finish()
    run = offline_run(run_dir)
    logged = run.rows_with("val/predictions")[0]
    assert logged["step"] == 7 and logged["val/predictions"]["count"] == 5
    pictures, mask_files = logged["val/predictions"]["filenames"], logged["val/predictions"]["all_masks"]
    assert len(pictures) == len(mask_files) == 5
    assert all((run.directory / "files" / name).is_file() for name in pictures)
    files = {kind: run.directory / "files" / mask_files[0][kind]["path"] for kind in ("ground_truth", "predictions")}
    true_mask = np.asarray(PILImage.open(files["ground_truth"]))
    enlarged = masks[0].repeat_interleave(16, 0).repeat_interleave(16, 1)  # 8x8 drawn at 128x128
    assert np.array_equal(true_mask, enlarged.numpy())  # class indices, pixel for pixel
    assert np.asarray(PILImage.open(files["predictions"])).shape == (128, 128)
    names = run.config["_wandb"]["mask/class_labels"]["val/predictions_wandb_delimeter_ground_truth"]["value"]
    assert names == {"0": "background", "1": "disc", "2": "bar"}
