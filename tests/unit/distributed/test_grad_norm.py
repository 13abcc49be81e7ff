"""Parallel.grad_norm, what train.py logs as train/grad_norm: clip_grad_norm_'s norm in one process, and under
FSDP (2 processes on gloo, each holding half of every gradient) the whole model's, as one process computes it."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_distributed import free_port
from test_fsdp import _fsdp

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


def _sharded_norms(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        parallel = _fsdp(rank)
        model = parallel.prepare(SmallCNN(1, 10, widths=(8, 16)))
        _backward(model)
        norm, clipped_norm = parallel.grad_norm(model), parallel.grad_norm(model, 0.01)
        results[rank] = {"norm": norm, "clipped_norm": clipped_norm, "after_clipping": parallel.grad_norm(model)}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes
def test_under_fsdp_the_norm_over_both_ranks_shards_is_the_one_process_norm():
    torch.manual_seed(0)
    one_process = SmallCNN(1, 10, widths=(8, 16))
    _backward(one_process)
    expected = Parallel().grad_norm(one_process)
    results = mp.Manager().dict()
    mp.spawn(_sharded_norms, args=(free_port(), results), nprocs=2)
    for rank in (0, 1):
        norms = results[rank]
        assert type(norms["norm"]) is torch.Tensor  # a plain tensor, the same on every rank: not a DTensor shard
        torch.testing.assert_close(norms["norm"], expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(norms["clipped_norm"], expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(norms["after_clipping"], torch.tensor(0.01), rtol=1e-4, atol=0)
