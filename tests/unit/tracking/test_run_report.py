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
