"""logger=tensorboard, read back with TensorBoard's own reader (EventAccumulator)."""

import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import composed
from trainkit.tracking.loggers import build_loggers

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

CONFIG = {"seed": 0, "optimizer": {"lr": 0.1, "name": "sgd"}, "data": {"mean": [0.5]}, "resume": None}
PROVENANCE = {"code": "abc1234+dirty", "git": {"commit": "abc1234" * 5, "branch": "main", "dirty": True}}


def events(run_dir) -> EventAccumulator:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_tensorboard_shows_predictions_by_default():
    """A language model's text sample after each validation (task.sample_tokens)."""
    assert composed("logger=tensorboard").logger.log_predictions == 4


def test_tensorboard_writes_scalars_images_text_and_hparams_in_the_run_folder(tmp_path):
    cfg = OmegaConf.create({"trackers": {"tensorboard": True}, "log_images": True})
    loggers = build_loggers(cfg, tmp_path, config=CONFIG, provenance=PROVENANCE)
    loggers.log({"epoch": 0, "step": 5, "train/step_loss": 2.0, "lr": 0.1})
    loggers.log({"epoch": 0, "step": 10, "val/acc": 0.5, "val/loss": float("nan")})
    loggers.log_image("train/samples", np.zeros((8, 12, 3), dtype=np.uint8), step=0)
    loggers.summary({"best/val/acc": 0.5, "test/acc": 0.75, "stop_reason": "max_epochs"})
    loggers.finish()
    assert [p.parent for p in tmp_path.rglob("events.out.tfevents.*")] == [tmp_path, tmp_path]  # no subfolder
    found = events(tmp_path)
    assert [(e.step, e.value) for e in found.Scalars("train/step_loss")] == [(5, 2.0)]
    assert [(e.step, e.value) for e in found.Scalars("val/acc")] == [(10, 0.5)]
    assert "epoch" not in found.Tags()["scalars"]
    assert found.Scalars("hparam/test/acc")[0].value == 0.75
    image = found.Images("train/samples")[0]
    assert (image.width, image.height) == (12, 8)
    text = {tag: found.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in found.Tags()["tensors"]}
    assert "lr: 0.1" in text["config/text_summary"] and "abc1234+dirty" in text["provenance/text_summary"]


def test_a_text_sample_is_text_at_its_step_kept_verbatim(tmp_path):
    """What a language model's run hands the trackers after each validation (log_text), under its key."""
    loggers = build_loggers(OmegaConf.create({"trackers": {"tensorboard": True}}), tmp_path)
    loggers.log_text("val/sample", "import os\n# *not* Markdown", step=6)
    loggers.log_text("val/sample", "import sys", step=12)
    loggers.finish()
    samples = events(tmp_path).Tensors("val/sample/text_summary")
    assert [event.step for event in samples] == [6, 12]
    assert samples[0].tensor_proto.string_val[0].decode() == "    import os\n    # *not* Markdown\n"


def test_tensorboard_resume_appends_and_hides_what_the_first_part_logged_after_the_checkpoint(tmp_path):
    cfg = OmegaConf.create({"trackers": {"tensorboard": True}})
    first = build_loggers(cfg, tmp_path)
    for step in (1, 2, 3):
        first.log({"epoch": 0, "step": step, "train/step_loss": float(step)})
    first.finish()
    # TensorBoard reads a folder's event files in name order, and a name holds the second it was made and then a
    # counter of writers in this process ("...9" sorts after "...10"): a real resume is a later process, so wait
    # for the next second as it would.
    time.sleep(1.01 - time.time() % 1)
    second = build_loggers(cfg, tmp_path, resume_step=1)  # the checkpoint stood at step 1
    second.log({"epoch": 0, "step": 2, "train/step_loss": 20.0})
    second.finish()
    assert [(e.step, e.value) for e in events(tmp_path).Scalars("train/step_loss")] == [(1, 1.0), (2, 20.0)]


def test_a_value_logged_again_at_the_same_step_is_held_once(tmp_path):
    """An epoch's last update logs `lr` with its step loss and again with the epoch metrics."""
    loggers = build_loggers(OmegaConf.create({"trackers": {"tensorboard": True}}), tmp_path)
    loggers.log({"epoch": 0, "step": 8, "lr": 0.1, "train/step_loss": 2.0})
    loggers.log({"epoch": 0, "step": 8, "lr": 0.1, "train/loss": 1.9, "val/acc": 0.5})
    loggers.log({"epoch": 0, "step": 8, "test/acc": 0.75})
    loggers.summary({"best/val/acc": 0.5, "test/acc": 0.75, "stop_reason": "max_epochs"})
    loggers.finish()
    assert [e.step for e in events(tmp_path).Scalars("lr")] == [8]
