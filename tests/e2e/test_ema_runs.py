"""EMA (trainkit.models.ema) in train.py's loop: updated after every optimizer update and evaluated in place of the
trained weights (a language model's GPT: test_language_model.py; a Hugging Face model: test_hf.py).
The average itself, its checkpoint, an
exact resume and eval.py: tests/unit/models/test_ema.py."""

from test_wiring import SHORT_RUN

from helpers import record_run


def test_ema_is_updated_every_step_and_is_what_is_evaluated(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "regularization.ema.enabled=true")
    assert recording.run.averaged.n_averaged.item() == 3  # one update per step
    assert len(recording.training_forwards()) == 3 and recording.eval_forwards() == []  # the EMA copy evaluates
