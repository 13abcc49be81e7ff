"""EMA (trainkit.models.ema) in train.py's loop: updated after every optimizer update and evaluated in place of the
trained weights, on each kind of model the loop trains (a language model's GPT, a Hugging Face model whose output
is a ModelOutput, with bf16, micro-batches and gradient checkpointing). The average itself, its checkpoint, an
exact resume and eval.py: tests/unit/models/test_ema.py."""

from pathlib import Path

import pytest
import torch
from test_hf import TINY_BERT, texts
from test_language_model import stdlib_corpus, tiny
from test_text_classification import write_texts
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


@pytest.fixture(scope="module")
def classified_texts(tmp_path_factory) -> Path:
    """train/<class>/*.txt (test_hf's corpus)."""
    return write_texts(tmp_path_factory.mktemp("texts") / "train", 45, seed=0).parent


def test_a_hugging_face_model_trains_with_ema_in_bf16_micro_batches_checkpointing(run_train, classified_texts):
    overrides = ["precision=bf16", "trainer.micro_batch_size=64", "model.gradient_checkpointing=true",
                 "regularization.ema.enabled=true"]  # fmt: skip
    run = run_train(*texts(classified_texts, TINY_BERT, "trainer.max_epochs=1", *overrides))
    best = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)
    averaged, model = best["averaged"], best["model"]
    assert averaged is not None and run.summary["test_weights"] == "best"
    average = {name.removeprefix("module."): value for name, value in averaged.items() if name != "n_averaged"}
    assert average.keys() == model.keys() and averaged["n_averaged"] > 0  # every update taken in
    moved = [name for name in model if model[name].is_floating_point() and not torch.equal(model[name], average[name])]
    assert moved  # the average lags the trained weights: EMA changed what is kept (and tested)
