"""Every option that changes training reaches the loop: short in-process runs of train.py's `train()`
on the digits, watched from inside. Each test turns one option on and checks an exact observation
of what the loop did (what reached the model's forward, the task's loss, the optimizer step), so an
option that is accepted but no longer wired to the loop fails here. The cuts these tests were
checked against are listed in CONTRIBUTING.md ("Wiring"); a new option adds a row there.

The watching is done by hooks on the pieces that train.py's build_run makes (forward hooks on the
model, a step pre-hook on the optimizer, wrappers around the train transform and the task's loss),
so the loop itself runs unchanged.
"""

import logging
import math
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import composed
from helpers import record_run

# A narrow CNN, three batches of 8 digits and one validation batch: a run takes about a second.
SHORT_RUN = (
    "device=cpu",
    "print_config=false",
    "data.batch_size=8",
    "data.eval_batch_size=128",
    "model.widths=[8,16]",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "regularization=none",
    "scheduler=constant",
)
# 3-channel data (tests/data_for_tests.py): for channels_last, which leaves a 1-channel batch as it is.
THREE_CHANNELS = ("data._target_=data_for_tests.ThreeChannelDigits", "data.channels=3")


# ---- what the model sees: augmentation, mixing, precision, memory layout, compile -----------------


def test_the_model_trains_on_augmented_batches(tmp_path, monkeypatch):
    """Each training batch is the train transform's output, which is not the eval transform's (a
    random shift per sample moves every 8x8 digit): augmentation=none would give the same."""
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "augmentation=shift")
    run = recording.run
    assert len(recording.transformed) == len(recording.training_forwards()) == 3
    for (images, transformed), forward in zip(recording.transformed, recording.training_forwards(), strict=True):
        assert torch.equal(forward.inputs, transformed)
        assert not torch.equal(transformed, run.eval_transform(images))


def test_the_task_s_loss_is_trained_on_and_its_metrics_are_reported(tmp_path, monkeypatch):
    """train/loss and train/acc of the epoch are the task's, from the outputs and targets it was given."""
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN)
    outputs = torch.cat([outputs for outputs, _, _ in recording.losses])
    targets = torch.cat([targets for _, targets, _ in recording.losses])
    correct = (outputs.argmax(dim=1) == targets).sum().item()
    assert len(targets) == 24 and 0 < correct < 24  # (seed 0: neither all right nor all wrong)
    final = recording.summary["final"]
    assert final["train/acc"] == correct / 24
    assert final["train/loss"] == pytest.approx(sum(loss.item() * 8 for _, _, loss in recording.losses) / 24)


def test_label_smoothing_is_in_the_training_loss(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "regularization.label_smoothing=0.3")
    for outputs, targets, loss in recording.losses:
        torch.testing.assert_close(loss, F.cross_entropy(outputs, targets, label_smoothing=0.3))
        assert not torch.allclose(loss, F.cross_entropy(outputs, targets))


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_reaches_the_training_and_evaluation_forward(tmp_path, monkeypatch, precision, dtype):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, f"precision={precision}")
    training, evaluation = recording.training_forwards(), recording.eval_forwards()
    assert len(training) == 3 and len(evaluation) >= 2  # validation and test
    assert {forward.output_dtype for forward in training + evaluation} == {dtype}


def test_channels_last_reaches_the_weights_and_the_batches(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, *THREE_CHANNELS, "trainer.channels_last=true")
    first_conv = recording.run.model.features[0].weight
    assert first_conv.is_contiguous(memory_format=torch.channels_last) and not first_conv.is_contiguous()
    for forward in recording.forwards:  # training and evaluation batches
        assert forward.inputs.is_contiguous(memory_format=torch.channels_last) and not forward.inputs.is_contiguous()


class FakeCompiled(torch.nn.Module):
    """What torch.compile returns, without compiling: the model, a first call that takes
    COMPILE_SECONDS (compiling), and a count of the calls that went through it."""

    COMPILE_SECONDS = 2.0

    def __init__(self, model):
        super().__init__()
        self._orig_mod, self.calls = model, 0  # _orig_mod: where unwrap_model finds the model

    def forward(self, x):
        if self.calls == 0:
            time.sleep(self.COMPILE_SECONDS)
        self.calls += 1
        return self._orig_mod(x)


def test_compile_wraps_what_the_loop_calls_and_its_first_step_is_not_throughput(tmp_path, monkeypatch, caplog):
    """torch.compile replaced by FakeCompiled: every forward of the run goes through it, and the first
    step's compile time is logged apart and left out of train/samples_per_sec."""
    monkeypatch.setattr(torch, "compile", FakeCompiled)
    with caplog.at_level(logging.INFO, logger="train"):
        recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.compile=true")
    compiled = recording.run.trained_model
    assert isinstance(compiled, FakeCompiled) and compiled.calls == len(recording.forwards)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile + first step")]
    assert float(line.split(": ")[1].split("s ")[0]) >= FakeCompiled.COMPILE_SECONDS
    # 16 timed samples in two ordinary steps; counting the first step too would give < 24 / 2 s.
    assert recording.summary["final"]["train/samples_per_sec"] > 24 / FakeCompiled.COMPILE_SECONDS


# ---- what the optimizer step sees: clipping, schedules, the LR finder, head LR, micro-batches ----------


def test_grad_clip_bounds_the_gradient_norm_at_every_step(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.grad_clip=0.01")
    assert len(recording.grad_norms) == 3
    assert recording.grad_norms == pytest.approx([0.01] * 3, rel=1e-3)  # a fresh CNN's gradient is far larger


def test_the_schedule_sets_the_lr_of_every_update(tmp_path, monkeypatch):
    overrides = ("scheduler=cosine", "scheduler.warmup_epochs=1", "trainer.max_epochs=2")
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, *overrides)
    # Expected from the config by hand, not from trainkit.optim: 3 updates an epoch, 2 epochs, so 6 updates; a
    # linear warmup over warmup_epochs x 3 updates, lr x (u + 1) / warmup, then a cosine from lr down to
    # min_lr_ratio x lr = 0 over the rest, lr x (1 + cos(pi x (u - warmup) / (6 - warmup))) / 2.
    cfg = composed(*SHORT_RUN, *overrides)
    assert cfg.scheduler.warmup_start_factor is None and cfg.scheduler.min_lr_ratio == 0
    assert not cfg.optimizer.scale_lr_with_batch
    lr, warmup, total = cfg.optimizer.lr, round(cfg.scheduler.warmup_epochs * 3), 6
    warming_up = [lr * (update + 1) / warmup for update in range(warmup)]
    decaying = [lr * (1 + math.cos(math.pi * (u - warmup) / (total - warmup))) / 2 for u in range(warmup, total)]
    assert warming_up + decaying == pytest.approx([0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.075, 0.025])
    assert [lrs[0] for lrs in recording.lrs] == pytest.approx(warming_up + decaying)


def test_head_lr_scale_holds_at_every_step(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "optimizer.head_lr_scale=10", "scheduler=cosine")
    assert {len(lrs) for lrs in recording.lrs} == {4}  # backbone decayed / not, head decayed / not
    for backbone, _, head, _ in recording.lrs:
        assert head == pytest.approx(10 * backbone)


def test_micro_batch_size_splits_each_batch_and_the_optimizer_steps_once_a_batch(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.micro_batch_size=3")
    forwards = recording.training_forwards()
    assert [len(forward.inputs) for forward in forwards] == [3, 3, 2] * 3
    assert len(recording.grad_norms) == 3  # one update per batch of 8
    for batch, (_, transformed) in enumerate(recording.transformed):  # the parts are the augmented batch, in order
        torch.testing.assert_close(torch.cat([f.inputs for f in forwards[3 * batch : 3 * batch + 3]]), transformed)


# ---- when training stops (freezing: tests/unit/models/test_finetune.py; EMA: test_ema.py) --------------


def test_early_stopping_ends_the_run_after_patience_epochs_without_improvement(tmp_path, monkeypatch):
    # min_delta=100: no epoch after the first improves on it by that much
    stopping = "regularization.early_stopping"
    overrides = (f"{stopping}.enabled=true", f"{stopping}.patience=1", f"{stopping}.min_delta=100")
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.max_epochs=5", *overrides)
    assert recording.summary["stop_reason"] == "early_stopping" and recording.summary["epochs"] == 2
