"""Loaders that shard a split across ranks: ShardedLoader's batch arithmetic, and TensorLoader for in-memory tensors.
`len()` is this rank's batches per epoch, `num_samples` its samples. Training loaders give every rank the same number
of samples; evaluation loaders give each sample to exactly one rank (docs/distributed.md)."""

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler, Sampler


class ResumableDistributedSampler(DistributedSampler):
    """torch's DistributedSampler with `drop_last=True`, whose `set_epoch(epoch, skip)` also drops the first `skip`
    indices of this rank's share, for a run resumed mid-epoch. `seed`: the run seed, the same on every rank."""

    def __init__(self, size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        indices: Any = range(size)  # the sampler uses only len() of its dataset: a range keeps it from holding the data
        super().__init__(indices, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.size, self.skip = size, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def epoch_indices(self) -> torch.Tensor:
        """The indices `iter()` yields this epoch, as one int64 tensor."""
        return torch.tensor(list(self), dtype=torch.int64)


class EvaluationSampler(Sampler[int]):
    """Rank r takes `range(size)[r::world_size]`, unpadded, so each sample counts exactly once; with a limit
    (set_limit), a seeded sample of the split, the same at every call, since its first samples may be of one class."""

    def __init__(self, size: int, *, rank: int = 0, world_size: int = 1, seed: int = 0):
        self.size = size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.skip = 0
        self.limit: int | None = None

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.skip = skip

    def set_limit(self, samples: int | None) -> None:
        self.limit = samples

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices().tolist())

    def __len__(self) -> int:
        share = len(range(self.rank, self.size, self.world_size))
        return share if self.limit is None else min(share, self.limit)

    def epoch_indices(self) -> torch.Tensor:
        if self.limit is None:
            return torch.arange(self.rank, self.size, self.world_size)[self.skip :]
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed))
        return order[self.rank :: self.world_size][: self.limit][self.skip :]


def shard_sampler(
    size: int, *, shuffle: bool, train: bool | None = None, seed: int = 0, rank: int = 0, world_size: int = 1
) -> ResumableDistributedSampler | EvaluationSampler:
    """This rank's sampler over a split of `size` samples; `train=None` means train = shuffle."""
    if train or (train is None and shuffle):
        return ResumableDistributedSampler(size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
    if shuffle:
        raise ValueError("an evaluation loader (train=False) keeps its order: pass shuffle=False")
    return EvaluationSampler(size, rank=rank, world_size=world_size, seed=seed)


class ShardedLoader:
    """What both loaders share: batch arithmetic and the epoch passed to the sampler."""

    def __init__(self, sampler: ResumableDistributedSampler | EvaluationSampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Reshuffles for `epoch` and skips the first `start_batch` batches, which a resumed run already trained."""
        self.epoch, self.start_batch = epoch, start_batch
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All of this rank's batches of `epoch` as lists of sample indices, for a mid-epoch checkpoint."""
        self.sampler.set_epoch(epoch, skip=0)
        try:
            indices = self.sampler.epoch_indices()
        finally:
            self.set_epoch(self.epoch, self.start_batch)
        return [batch.tolist() for batch in indices.split(self.batch_size)[: len(self)]]

    def __len__(self) -> int:
        batches = len(self.sampler) / self.batch_size
        return math.floor(batches) if self.drop_last else math.ceil(batches)

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def num_samples(self) -> int:
        return len(self) * self.batch_size if self.drop_last else len(self.sampler)

    def sample(self, batches: int) -> Iterator[Any]:
        """At most `batches` batches: a seeded sample of an evaluation split, or a training loader's first."""
        if not isinstance(self.sampler, EvaluationSampler):
            yield from itertools.islice(self, batches)
            return
        self.sampler.set_limit(batches * self.batch_size)
        try:
            yield from self
        finally:
            self.sampler.set_limit(None)


def limited(loader: Iterable[Any], batches: int | None) -> Iterable[Any]:
    """The batches an evaluation limited to `batches` per process reads (trainer.limit_val_batches); None: all."""
    if batches is None:
        return loader
    if isinstance(loader, ShardedLoader):
        return loader.sample(batches)
    return itertools.islice(loader, batches)


class TensorLoader(ShardedLoader):
    """A whole split held as two tensors on the device; a batch is one gather, a fresh tensor safe to modify. Data too
    big for the GPU stays on the host with `pin_memory=True`, each batch pinned for an asynchronous copy."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        drop_last: bool = False,
        device: torch.device = torch.device("cpu"),
        pin_memory: bool = False,
        **sampling: Any,  # shard_sampler's: shuffle, and train, seed, rank, world_size
    ):
        super().__init__(shard_sampler(len(images), **sampling), batch_size, drop_last)
        self.pin_memory = pin_memory
        self.images = images.to(device)
        self.labels = labels.to(device)  # in their own dtype: the task casts

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices = self.sampler.epoch_indices().to(self.images.device)
        for batch in indices.split(self.batch_size)[: len(self) - self.start_batch]:
            # index_select, not images[batch]: the same gather, several times faster on a CPU.
            images, labels = self.images.index_select(0, batch), self.labels.index_select(0, batch)
            if self.pin_memory:  # held on the host for a GPU: train.py's non_blocking copy overlaps compute
                images, labels = images.pin_memory(), labels.pin_memory()
            yield images, labels
