"""Loaders that shard a split across ranks: one sampler rule, two ways of fetching a batch.

Both loaders share the contract train.py relies on: iterate for `(images, labels)`,
`len()` is this rank's batch count, `num_samples` this rank's samples per epoch, and
`set_epoch(epoch)` reshuffles deterministically before each epoch.
"""

import math

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class ShardSampler(Sampler[int]):
    """This rank's indices into a split of `size` samples, like DistributedSampler.

    Shuffled: every rank draws the same permutation from `seed + epoch` (so `seed` must be
    the run seed, identical on every rank), trims it to a multiple of `world_size` and
    takes its strided share, so all ranks see the same number of samples and batches and
    their collectives stay in step. Not shuffled (evaluation): rank r takes
    `range(size)[r::world_size]` untrimmed, so across ranks each sample counts exactly
    once and shares differ by at most one sample.
    """

    def __init__(self, size: int, *, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skip = 0  # indices of this epoch already consumed (a run resumed mid-epoch)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def indices(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.rank, self.size, self.world_size)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        return order[: self.size - self.size % self.world_size][self.rank :: self.world_size]

    def __iter__(self):
        return iter(self.indices()[self.skip:].tolist())

    def __len__(self) -> int:
        if self.shuffle:
            return self.size // self.world_size
        return len(range(self.rank, self.size, self.world_size))


class ShardedLoader:
    """What both loaders share: batch arithmetic and the epoch passed to the sampler."""

    def __init__(self, sampler: ShardSampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Reshuffle for `epoch`; `start_batch` > 0 skips the batches a resumed run already trained
        (the rest of the epoch is exactly what the interrupted run would have seen)."""
        self.start_batch = start_batch
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)

    @property
    def num_samples(self) -> int:
        if self.drop_last:
            return len(self) * self.batch_size
        return len(self.sampler)


class TensorLoader(ShardedLoader):
    """A whole split held as two tensors on the device; a batch is one gather (airbench style).

    No DataLoader, no collate, no worker processes: for data that fits in memory this
    removes nearly all per-step overhead. Batches are fresh tensors, safe to modify in place.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool = False,
        device: torch.device = torch.device("cpu"),
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        sampler = ShardSampler(len(images), shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        super().__init__(sampler, batch_size, drop_last)
        self.images = images.to(device)
        self.labels = labels.to(device=device, dtype=torch.int64)

    def __iter__(self):
        # One host-to-device copy of the epoch's indices, then every batch is a slice of it.
        indices = self.sampler.indices()[self.sampler.skip:].to(self.images.device)
        for batch in indices.split(self.batch_size)[: len(self) - self.start_batch]:
            yield self.images[batch], self.labels[batch]


class FileLoader(ShardedLoader):
    """A torch DataLoader over files decoded in worker processes, sharded by a ShardSampler.

    Batches stay on the CPU (pinned when training on CUDA) for train.py to move with
    `non_blocking=True`, overlapping the copy with compute.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        sampler = ShardSampler(len(dataset), shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        super().__init__(sampler, batch_size, drop_last)
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=pin_memory,
            # DataLoader seeds worker i of this rank (torch, random, numpy) from a base seed
            # drawn from this generator plus i: different in every worker and on every rank.
            generator=torch.Generator().manual_seed(seed + rank),
        )

    def __iter__(self):
        return iter(self.loader)
