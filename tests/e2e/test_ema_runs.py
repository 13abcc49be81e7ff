"""EMA (trainkit.models.ema) in train.py's loop: updated after every optimizer update and evaluated in place of the
trained weights, on each kind of model the loop trains (a language model's GPT; a Hugging Face model: test_hf.py).
The average itself, its checkpoint, an
exact resume and eval.py: tests/unit/models/test_ema.py."""

from pathlib import Path

import pytest
import torch
from test_language_model import stdlib_corpus, tiny
from test_wiring import SHORT_RUN

from helpers import record_run

EMA = ("regularization.ema.enabled=true", "regularization.ema.decay=0.9")


def test_ema_is_updated_every_step_and_is_what_is_evaluated(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "regularization.ema.enabled=true")
    assert recording.run.averaged.n_averaged.item() == 3  # one update a step
    assert len(recording.training_forwards()) == 3 and recording.eval_forwards() == []  # the EMA copy evaluates


@pytest.fixture(scope="module")
def source_files(tmp_path_factory) -> Path:
    return stdlib_corpus(tmp_path_factory.mktemp("corpus"))


def test_a_language_model_trains_with_ema(run_train, source_files):
    run = run_train(*tiny(source_files, *EMA))
    assert run.summary["test"]["test/bpb"] < 8  # learning: ln(256) nats is 8 bits
    assert torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)["averaged"] is not None
