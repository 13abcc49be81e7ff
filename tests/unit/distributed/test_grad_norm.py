"""Parallel.grad_norm, what train.py logs as train/grad_norm: clip_grad_norm_'s norm in one process (FSDP's, over
every rank's shards, is checked in test_fsdp.py)."""

import copy

import torch

from trainkit.distributed.parallel import Parallel
from trainkit.models.small_cnn import SmallCNN


def _backward(model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(3)  # the same batch on every rank: the averaged gradients are its own
    inputs, targets = torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()


def test_the_norm_is_clip_grad_norm_s_and_clipping_clips_as_it_does():
    torch.manual_seed(0)
    model = SmallCNN(1, 10, widths=(8, 16))
    reference = copy.deepcopy(model)
    _backward(model)
    _backward(reference)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    assert torch.equal(Parallel().grad_norm(model), expected)  # no max_norm: the gradients are left as they are
    assert torch.equal(Parallel().grad_norm(model, 0.01), expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), reference.parameters()))


def test_a_model_without_gradients_has_norm_zero_as_clip_grad_norm_says():
    model = SmallCNN(1, 10, widths=(8, 16))  # no backward yet: every .grad is None
    assert torch.equal(Parallel().grad_norm(model), torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    assert torch.equal(Parallel().grad_norm(model), torch.tensor(0.0))
