"""logger.log_predictions: the fixed validation samples (first_images) and what log_predictions hands the trackers
after each validation (a language model's text, nothing for a class an image; a segmentation's masks:
tests/unit/tasks/test_segmentation_task.py), seen by a tracker that records its calls; each tracker's own tests read
back what it draws."""

import torch

from helpers import TrackerCalls
from trainkit.tasks.classification import Classification
from trainkit.tasks.language_model import LanguageModel
from trainkit.tracking.loggers import Loggers
from trainkit.tracking.prediction_images import log_predictions

CPU = torch.device("cpu")


def test_log_predictions_shows_nothing_for_a_class_an_image():
    task = Classification(num_classes=3)
    shown = (torch.rand(4, 1, 8, 8), torch.randint(0, 3, (4,)))
    tracker = TrackerCalls()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", CPU, step=1)
    assert tracker.calls == []


def test_log_predictions_hands_the_trackers_a_language_models_text_sample():
    task = LanguageModel(sample_tokens=10, prompt_bytes=4)
    shown = (torch.tensor([list(b"import os\n")]), torch.zeros(1, 10, dtype=torch.long))
    tracker = TrackerCalls()
    model = torch.nn.Embedding(256, 256)  # logits for the next byte, from each byte
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", CPU, step=6)
    [(method, (key, text, step))] = tracker.calls
    assert (method, key, step) == ("log_text", "val/sample", 6)
    assert text == task.sample_for_logging(model, shown)[1] and text.startswith("impo")
