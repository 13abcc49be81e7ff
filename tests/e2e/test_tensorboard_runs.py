"""logger=tensorboard end to end: a run stopped and resumed, and one killed and resumed, read back with TensorBoard's
own reader (EventAccumulator)."""

import os

import pytest

from helpers import killed_and_resumed

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TINY = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.progress_bar=false")


def test_tensorboard_continues_on_resume(run_train):
    first = run_train(*TINY, "logger=tensorboard", "trainer.max_epochs=1")
    resumed = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir)
    assert resumed.summary["epochs"] == 2
    events = EventAccumulator(str(first.run_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val/acc")] == [
        (m["step"], pytest.approx(m["val/acc"])) for m in resumed.metrics if "val/acc" in m
    ]
    assert "train/samples" in events.Tags()["images"] and "config/text_summary" in events.Tags()["tensors"]
    if (first.run_dir / "provenance.json").is_file():  # none where the provenance capability is trimmed away
        assert "provenance/text_summary" in events.Tags()["tensors"]
    assert events.Scalars("hparam/test/acc")[-1].value == pytest.approx(resumed.summary["test"]["test/acc"])
    assert not [p for p in os.listdir(first.run_dir) if p.replace(".", "").isdigit()]  # no timestamped hparams folder


@pytest.mark.slow  # trains in a subprocess that is killed, then resumes
def test_after_a_sigkill_and_a_resume_tensorboard_holds_every_step_once(run_train, monkeypatch):
    killed, _, expected = killed_and_resumed(run_train, monkeypatch, "logger=tensorboard")
    events = EventAccumulator(str(killed.run_dir), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if not tag.startswith("hparam/")]
    assert sorted((tag, e.step) for tag in tags for e in events.Scalars(tag)) == expected
    assert [image.step for image in events.Images("train/samples")] == [0]  # logged by the first part only
