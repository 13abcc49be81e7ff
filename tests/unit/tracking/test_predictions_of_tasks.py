"""logger.log_predictions with the tasks that draw or write their predictions: a segmentation's masks and a language
model's text sample, as log_predictions hands them to a tracker that records its calls (the runs: tests/e2e/)."""

import torch

from helpers import TrackerCalls
from trainkit.data import TensorLoader
from trainkit.tasks.language_model import LanguageModel
from trainkit.tasks.segmentation import Segmentation
from trainkit.tracking.loggers import Loggers
from trainkit.tracking.prediction_images import first_images, log_predictions


def test_log_predictions_hands_the_trackers_fixed_validation_images_with_true_and_predicted_masks():
    task = Segmentation(num_classes=3, class_names=["background", "disc", "bar"])
    images, masks = torch.rand(6, 1, 8, 8), torch.randint(0, 3, (6, 8, 8))
    shown = first_images(TensorLoader(images, masks, 4, shuffle=False), task, 5, torch.device("cpu"))
    assert torch.equal(shown[0], images[:5]) and torch.equal(shown[1], masks[:5])  # across batches, in order
    tracker = TrackerCalls()
    model = torch.nn.Conv2d(1, 3, kernel_size=1)
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", torch.device("cpu"), step=7)
    [(method, (key, pictures, true_masks, predicted_masks, class_names, step))] = tracker.calls
    assert (method, key, step, class_names) == ("log_masks", "val/predictions", 7, ["background", "disc", "bar"])
    assert pictures.dtype == torch.uint8 and pictures.shape == (5, 128, 128, 3)  # 8x8 drawn at 128x128, RGB
    enlarged = masks[:5].repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert torch.equal(true_masks, enlarged)  # class indices, pixel for pixel
    with torch.no_grad():
        expected = model(images[:5]).argmax(1).repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert torch.equal(predicted_masks, expected)


def test_log_predictions_hands_the_trackers_a_language_models_text_sample():
    task = LanguageModel(sample_tokens=10, prompt_bytes=4)
    shown = (torch.tensor([list(b"import os\n")]), torch.zeros(1, 10, dtype=torch.long))
    tracker = TrackerCalls()
    model = torch.nn.Embedding(256, 256)  # logits for the next byte, from each byte
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", torch.device("cpu"), step=6)
    [(method, (key, text, step))] = tracker.calls
    assert (method, key, step) == ("log_text", "val/sample", 6)
    assert text == task.sample_for_logging(model, shown)[1] and text.startswith("impo")
