"""logger.log_predictions: the fixed validation samples (first_images) and what log_predictions hands the trackers
after each validation (a mask task's images with their true and predicted masks, nothing for a class an image; a
language model's text: test_language_model_task.py), seen by a tracker that records its calls; each tracker's own
tests read back what it draws."""

import torch

from helpers import TrackerCalls
from trainkit.data import TensorLoader
from trainkit.tasks.classification import Classification
from trainkit.tasks.segmentation import Segmentation
from trainkit.tracking.loggers import Loggers
from trainkit.tracking.prediction_images import first_images, log_predictions

CPU = torch.device("cpu")


def test_log_predictions_hands_the_trackers_fixed_validation_images_with_true_and_predicted_masks():
    task = Segmentation(num_classes=3, class_names=["background", "disc", "bar"])
    images, masks = torch.rand(6, 1, 8, 8), torch.randint(0, 3, (6, 8, 8))
    shown = first_images(TensorLoader(images, masks, 4, shuffle=False), task, 5, CPU)
    assert torch.equal(shown[0], images[:5]) and torch.equal(shown[1], masks[:5])  # across batches, in order
    tracker = TrackerCalls()
    model = torch.nn.Conv2d(1, 3, kernel_size=1)
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", CPU, step=7)
    [(method, (key, pictures, true_masks, predicted_masks, class_names, step))] = tracker.calls
    assert (method, key, step, class_names) == ("log_masks", "val/predictions", 7, ["background", "disc", "bar"])
    assert pictures.dtype == torch.uint8 and pictures.shape == (5, 128, 128, 3)  # 8x8 drawn at 128x128, RGB
    enlarged = masks[:5].repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert torch.equal(true_masks, enlarged)  # class indices, pixel for pixel
    with torch.no_grad():
        expected = model(images[:5]).argmax(1).repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert torch.equal(predicted_masks, expected)


def test_log_predictions_shows_nothing_for_a_class_an_image():
    task = Classification(num_classes=3)
    shown = (torch.rand(4, 1, 8, 8), torch.randint(0, 3, (4,)))
    tracker = TrackerCalls()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", CPU, step=1)
    assert tracker.calls == []
