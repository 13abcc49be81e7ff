"""The start line says when micro-batches split each batch, and that BatchNorm then sees fewer samples."""

from omegaconf import OmegaConf

from models_for_tests import NoNormCNN
from trainkit.models.small_cnn import SmallCNN
from trainkit.tracking.run_report import training_line


def trainer(micro_batch_size):
    return OmegaConf.create({"max_epochs": 2, "max_steps": None, "micro_batch_size": micro_batch_size})


def test_the_start_line_names_the_micro_batches_and_what_batchnorm_sees():
    line = training_line(SmallCNN(1, 10), trainer(16), 5, "cpu", "run", batch_size=64)
    assert "each batch of 64 in micro-batches of 16 (BatchNorm normalizes over 16 samples, not 64)" in line
    assert "BatchNorm" not in training_line(NoNormCNN(1, 10), trainer(16), 5, "cpu", "run", batch_size=64)
    for micro in (None, 64):  # no split
        assert "micro-batches" not in training_line(SmallCNN(1, 10), trainer(micro), 5, "cpu", "run", batch_size=64)


def test_one_epoch_is_said_in_the_singular():
    one = OmegaConf.create({"max_epochs": 1, "max_steps": None, "micro_batch_size": None})
    assert " for 1 epoch (5 updates) -> run" in training_line(NoNormCNN(1, 10), one, 5, "cpu", "run")
    assert " for 2 epochs (5 updates each) -> run" in training_line(NoNormCNN(1, 10), trainer(None), 5, "cpu", "run")
