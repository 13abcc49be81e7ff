"""logger.log_images and logger.log_predictions, the logged_images row: their checks beside the code, the
predictions that no data but images and tokens shows, each tracker's default; the fixed validation samples
(first_images) and what log_predictions hands the trackers after each validation (nothing for classification, a
dict batch and a tuple output taken as evaluation takes them; a segmentation's masks and a language model's text:
test_predictions_of_tasks.py), seen by a tracker that records its calls; each tracker's own tests read back what it
draws."""

import torch
from omegaconf import OmegaConf

from conftest import ROOT, composed
from data_for_tests import signals
from helpers import TrackerCalls, assert_one_config_error
from models_for_tests import LengthsNet
from tasks_for_tests import SignalClassification
from trainkit.config.validation import ignored_keys, unread_settings
from trainkit.tasks.classification import Classification
from trainkit.tracking.loggers import Loggers, trackers
from trainkit.tracking.prediction_images import first_images, log_predictions

CPU = torch.device("cpu")
LOGGER_CONF = ROOT / "conf" / "logger"
TABLE = [  # the digits as a table (tests/data_for_tests.py): data that is not images, without their keys
    "data._target_=data_for_tests.DigitsTable",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",  # model=cnn reads data.channels, which a table has not
]


def test_log_predictions_is_checked_beside_its_code():
    assert_one_config_error(["logger.log_predictions=-1"], "logger.log_predictions")


def test_predictions_of_data_that_is_neither_images_nor_tokens_are_said_to_be_ignored():
    shown = composed(*TABLE, "logger.log_predictions=4")
    assert unread_settings(shown, chosen=()) == {
        "logger.log_predictions": "digits is neither images nor token sequences, whose predictions alone are shown"
    }
    assert ignored_keys(shown) == [
        "logger.log_predictions=4 is ignored: digits is neither images nor token sequences, whose predictions alone "
        "are shown; leave it 0"
    ]
    assert unread_settings(composed("logger.log_predictions=4"), chosen=()) == {}  # images: shown


def test_log_predictions_shows_nothing_for_one_class_per_image():
    task = Classification(num_classes=3)
    shown = (torch.rand(4, 1, 8, 8), torch.randint(0, 3, (4,)))
    tracker = TrackerCalls()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    log_predictions(Loggers([tracker]), model, shown, lambda x: x, task, "fp32", CPU, step=1)
    assert tracker.calls == []


def test_the_prediction_samples_take_a_dict_batch_and_a_model_that_returns_a_tuple():
    """The tracker's prediction samples (first_images, log_predictions) go through the task's batch contract as
    evaluation does: a dict batch, and a model that returns (logits, aux)."""
    torch.manual_seed(0)
    batches = [signals(5, seed) for seed in range(3)]
    model, task = LengthsNet(9, 10), SignalClassification(num_classes=10)
    shown = first_images(batches, task, 4, CPU)  # the first 4 samples, a dict batch as the loader's
    assert set(shown) == {"signal", "lengths", "label"} and torch.equal(shown["label"], batches[0]["label"][:4])
    assert torch.equal(shown["signal"], batches[0]["signal"][:4])
    log_predictions(Loggers([]), model, shown, torch.nn.Identity(), task, "fp32", CPU, step=1)  # a class: no picture


def test_every_tracker_that_shows_predictions_shows_them_by_default():
    """One default, 4, in each tracker file that has logger.log_predictions (each tracker's test names its own);
    with several trackers one value, which the command line sets for all; no tracker: conf/config.yaml's 0."""
    shows = [name for name in trackers() if "log_predictions" in OmegaConf.load(LOGGER_CONF / f"{name}.yaml")]
    for name in shows:
        assert composed(f"logger={name}").logger.log_predictions == 4, name
    every = f"logger=[{','.join(['none', *trackers()])}]"
    assert composed(every).logger.log_predictions == (4 if shows else 0)  # no tracker that shows them: none drawn
    assert composed(every, "++logger.log_predictions=0").logger.log_predictions == 0
    assert composed().logger.log_predictions == 0
