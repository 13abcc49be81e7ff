"""logger.log_predictions: the fixed validation samples (first_images) and what log_predictions hands the trackers
after each validation (nothing for classification; a language model's text: test_language_model_task.py; a
segmentation's masks: tests/unit/tasks/test_segmentation_task.py), seen by a tracker that records its calls; each
tracker's own tests read back what it draws."""

import torch

from helpers import TrackerCalls
from trainkit.tasks.classification import Classification
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
