"""What train.py logs at each logging step without a loop edit: train/grad_norm, the norm clipping computes
(after the fp16 unscale), read from the device at logging steps only; and what a task records in its step."""

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT
from helpers import loop_config
from trainkit.data import DataBundle, TensorLoader
from trainkit.distributed.process_group import ProcessInfo
from trainkit.runtime import grad_scaler
from trainkit.tasks.classification import Classification
from trainkit.tracking import EpochTotals
from trainkit.tracking.loggers import Loggers

sys.path.insert(0, str(ROOT))
import train

CPU = torch.device("cpu")


class Rows:
    """A logger that keeps what it is given."""

    def __init__(self):
        self.rows: list[dict] = []

    def log(self, metrics: dict) -> None:
        self.rows.append(metrics)


class RecordsItsInputMean(Classification):
    """Records the mean of its inputs each step: a value the test can compute by hand."""

    def step(self, model, batch):
        self.record("input_mean", batch[0].mean())
        return super().step(model, batch)


def linear_run(
    num_samples: int = 64,
    batch_size: int = 8,
    scaler_enabled: bool = False,
    task_class: type = Classification,
    **trainer,
) -> train.Run:
    """train.py's Run of a linear model on random images, its logged rows in run.loggers.loggers[0].rows."""
    torch.manual_seed(0)
    images = torch.rand(num_samples, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 3, (num_samples,), generator=torch.Generator().manual_seed(2))
    cfg = OmegaConf.merge(loop_config(), {"trainer": trainer})
    run = train.Run(cfg, Path("unused"), ProcessInfo(), CPU)
    loader = TensorLoader(images, labels, batch_size, shuffle=False)
    run.data = DataBundle(loader, loader, loader, channels=1, image_size=4, num_classes=3, mean=(0.0,), std=(1.0,))
    run.model = run.trained_model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    run.train_transform = lambda x: x
    run.task = task_class(num_classes=3)
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=0.5)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    run.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaler_enabled)
    run.loggers = Loggers([Rows()])
    return run


def backward(run: train.Run, inputs: torch.Tensor, targets: torch.Tensor, totals: EpochTotals) -> torch.nn.Module:
    """One batch through train.train_step (scaled when the scaler is on); returns a copy of the model with the
    same batch's unscaled gradients, computed apart: what the test compares with."""
    reference = copy.deepcopy(run.model)
    torch.nn.functional.cross_entropy(reference(inputs), targets).backward()
    train.train_step(run, (inputs, targets), totals=totals)
    return reference


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_grad_norm_is_the_unscaled_norm_of_clip_grad_norm_and_clipping_is_torch_s(grad_clip):
    """fp16 loss scaling (torch's GradScaler, on the CPU): the logged norm is the true gradients' norm, as
    clip_grad_norm_ gives it on gradients computed without scaling, and the update is the clipped one."""
    run = linear_run(scaler_enabled=True)
    inputs, targets = torch.rand(8, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    totals = EpochTotals(CPU)
    reference = backward(run, inputs, targets, totals)
    assert run.model[1].weight.grad.abs().max() > 100 * reference[1].weight.grad.abs().max()  # scaled by 1024
    train.update(run, totals, grad_clip, logging=True)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), grad_clip or 1e9)
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    assert torch.equal(totals.grad_norm, expected)
    assert expected > 0.05  # clipped where grad_clip is 0.05
    for trained, hand in zip(run.model.parameters(), reference.parameters()):
        torch.testing.assert_close(trained, hand, rtol=0, atol=1e-7)


def test_an_inf_gradient_is_logged_and_the_scaler_skips_its_update_without_a_warning_on_the_schedule():
    """The first update is the skipped one, as it often is under fp16: the schedule steps all the same (it counts
    updates), and PyTorch's warning that the schedule stepped before the optimizer stays silent."""
    run = linear_run()
    run.scaler = grad_scaler("fp16", CPU)  # train.py's
    totals = EpochTotals(CPU)
    backward(run, torch.rand(8, 1, 4, 4), torch.zeros(8, dtype=torch.long), totals)
    run.model[1].bias.grad[0] = float("inf")
    before = [parameter.detach().clone() for parameter in run.model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        train.update(run, totals, None, logging=True)
    assert [str(warning.message) for warning in caught] == []
    assert run.scheduler.last_epoch == 1
    assert totals.grad_norm == float("inf")
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))  # skipped
    assert train.log_update(run, totals, every=1) is not None
    assert run.loggers.loggers[0].rows[-1]["train/grad_norm"] == float("inf")


def test_between_logging_steps_no_value_is_read_from_a_tensor(monkeypatch):
    """8 updates, clipped (so the norm is computed at every update), logged every 4th: Tensor.item, tolist,
    __bool__, __float__ and __int__ (what reads a device value to the host) are called at logging steps and at the
    epoch's end only. This counts Python-level reads; a read inside a torch C++ op would not show here."""
    run = linear_run(grad_clip=1.0, log_every_n_steps=4)
    reads_at: list[int] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            reads_at.append(run.state.step)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    train.train_one_epoch(run, show_progress=False)
    monkeypatch.undo()
    assert run.state.step == 8 and reads_at and set(reads_at) <= {4, 8}
    rows = run.loggers.loggers[0].rows
    assert [row["step"] for row in rows] == [4, 8] and all(row["train/grad_norm"] > 0 for row in rows)


def test_a_task_s_recorded_value_is_logged_per_step_and_its_epoch_mean_is_by_weight():
    """Batches of 8, 8 and 4 (20 samples), logged every update: train/step_input_mean is each batch's input mean,
    the epoch's train/input_mean their mean by samples, which is the mean over all 20 samples."""
    run = linear_run(num_samples=20, task_class=RecordsItsInputMean, log_every_n_steps=1)
    metrics = train.train_one_epoch(run, show_progress=False)
    rows, images = run.loggers.loggers[0].rows, run.data.train.images  # not shuffled: batches in order
    per_batch = [images[start : start + 8].mean().item() for start in (0, 8, 16)]
    assert [row["train/step_input_mean"] for row in rows] == pytest.approx(per_batch, rel=1e-6)
    assert metrics["train/input_mean"] == pytest.approx(images.mean().item(), rel=1e-6)
    assert metrics["train/input_mean"] != pytest.approx(sum(per_batch) / 3, rel=1e-4)  # not the batches' plain mean
