"""Loaders that shard a split across ranks: in-memory tensors (TensorLoader) or files read in workers (FileLoader).

What train.py relies on: iterating yields batches, `len()` is this rank's batches per epoch, `num_samples` its
samples per epoch, `set_epoch(epoch, start_batch)` reshuffles from the seed and skips the batches a resumed run
already trained, and `epoch_batches(epoch)` lists an epoch's batches. Training loaders give every rank the same
number of samples; evaluation loaders give each sample to exactly one rank (docs/distributed.md). How file samples
draw the same with any workers, and how unreadable files are skipped: docs/data.md.
"""

import functools
import hashlib
import itertools
import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate, get_worker_info

from trainkit.data.images import BadFile
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)


class ResumableDistributedSampler(DistributedSampler):
    """torch's DistributedSampler with `drop_last=True`, whose `set_epoch(epoch, skip)` also drops the first `skip`
    indices of this rank's share, so that a run resumed mid-epoch continues where it stopped. `seed` must be the
    run seed, the same on every rank."""

    def __init__(self, size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        # The sampler uses only len() of its dataset: a range keeps it from holding the data.
        super().__init__(
            range(size),  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.skip = 0

    @property
    def size(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # the range above (the stubs say Dataset, unsized)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def epoch_indices(self) -> torch.Tensor:
        """The indices `iter()` yields this epoch, as one int64 tensor."""
        return torch.tensor(list(self), dtype=torch.int64)


class EvaluationSampler(Sampler[int]):
    """Rank r takes `range(size)[r::world_size]`, unpadded, so each sample counts exactly once.

    With a limit (set_limit) it takes a seeded sample of the split instead, the same at every call, since a split's
    first samples may all be of one class.
    """

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
    size: int, *, train: bool | None, shuffle: bool, seed: int, rank: int, world_size: int
) -> ResumableDistributedSampler | EvaluationSampler:
    """This rank's sampler over a split of `size` samples; `train=None` means train = shuffle."""
    if train is None:
        train = shuffle
    if train:
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
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def num_samples(self) -> int:
        if self.drop_last:
            return len(self) * self.batch_size
        return len(self.sampler)

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
    """A whole split held as two tensors on the device; a batch is one gather, a fresh tensor safe to modify.

    Data too big for the GPU stays on the host with `pin_memory=True`, each batch pinned for an asynchronous copy.
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
        pin_memory: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        train: bool | None = None,
    ):
        sampler = shard_sampler(len(images), train=train, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        super().__init__(sampler, batch_size, drop_last)
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


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit hash of (seed, epoch, index), so that neighbouring samples and epochs get unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SeededIndices:
    """A sampler (or, `batched`, a batch sampler) whose indices come out as (index, sample_seed) pairs."""

    def __init__(self, indices: Iterable[Any], seed: int, *, batched: bool):
        self.indices, self.seed, self.batched = indices, seed, batched
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.indices)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        seed, epoch = self.seed, self.epoch

        def pair(index: Any) -> tuple[int, int]:
            return int(index), sample_seed(seed, epoch, int(index))

        if self.batched:
            return ([pair(index) for index in batch] for batch in self.indices)
        return (pair(index) for index in self.indices)


class SeededSamples(Dataset):
    """`dataset` read by (index, seed) pairs: the global generators are seeded with `seed` before each read. In the
    main process they are put back after each batch, so the training step draws as it would with workers."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset has a length

    def __getitem__(self, pair: tuple[int, int] | int) -> Any:
        if not isinstance(pair, tuple):  # a plain index: read unseeded
            return self.dataset[pair]
        return self.__getitems__([pair])[0]

    def __getitems__(self, pairs: list[tuple[int, int]]) -> list[Any]:
        """A batch's samples, each read after seeding with its own seed."""
        if get_worker_info() is not None:
            return [self._read(index, seed) for index, seed in pairs]
        # Saved and put back once a batch: NumPy's state alone takes longer to save than a small sample to read.
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            return [self._read(index, seed) for index, seed in pairs]
        finally:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])

    def _read(self, index: int, seed: int) -> Any:
        seed_global_generators(seed)
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def seed_global_generators(seed: int) -> None:
    """Seeds torch's, Python's and NumPy's global generators, which a sample's code draws from."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class FileLoader(ShardedLoader):
    """A torch DataLoader over files decoded in worker processes, sharded by this module's samplers. Batches stay
    on the CPU, pinned with `pin_memory`; `seed` is the run seed, the same on every rank."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        train: bool | None = None,
        collate: Callable[[list[Any]], Any] = default_collate,
        batch_sampler: Any = None,
    ):
        size = len(dataset)  # type: ignore[arg-type]
        sampler = shard_sampler(size, train=train, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        super().__init__(sampler, batch_size, drop_last)
        # The data option's own batch sampler shards, shuffles and resumes itself.
        self.batch_sampler = batch_sampler
        batched = batch_sampler is not None
        self.seeded = SeededIndices(batch_sampler if batched else sampler, seed, batched=batched)
        batching: dict[str, Any] = (
            dict(batch_sampler=self.seeded)
            if batched
            else dict(batch_size=batch_size, sampler=self.seeded, drop_last=drop_last)
        )
        self.dataset = dataset
        self.loader = DataLoader(
            SeededSamples(dataset),
            **batching,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            pin_memory=pin_memory,
            # Seeds the workers: only draws outside a sample's reading (a collate) differ by worker.
            generator=torch.Generator().manual_seed(seed + rank),
            collate_fn=functools.partial(collate_setting_aside_bad_files, collate=collate),
        )
        self.rank = rank
        self.bad_files: list[BadFile] = []

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.seeded.epoch = epoch
        if self.batch_sampler is None:
            return super().set_epoch(epoch, start_batch)
        self.epoch, self.start_batch = epoch, start_batch
        self.batch_sampler.set_epoch(epoch, start_batch=start_batch)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        if self.batch_sampler is None:
            return super().epoch_batches(epoch)
        self.batch_sampler.set_epoch(epoch, start_batch=0)
        try:
            return [[int(index) for index in batch] for batch in self.batch_sampler]
        finally:
            self.batch_sampler.set_epoch(self.epoch, start_batch=self.start_batch)

    def __len__(self) -> int:
        return super().__len__() if self.batch_sampler is None else len(self.batch_sampler)

    @property
    def num_samples(self) -> int:
        return super().num_samples if self.batch_sampler is None else self.batch_sampler.num_samples

    def sample(self, batches: int) -> Iterator[Any]:
        """As ShardedLoader.sample, drawn by the option's batch sampler where it has `set_limit`."""
        if self.batch_sampler is None or not isinstance(self.sampler, EvaluationSampler):
            yield from super().sample(batches)
            return
        if not hasattr(self.batch_sampler, "set_limit"):
            yield from itertools.islice(self, batches)
            return
        self.batch_sampler.set_limit(batches)
        try:
            yield from self
        finally:
            self.batch_sampler.set_limit(None)

    def __iter__(self) -> Iterator[Any]:
        self.bad_files = []
        try:
            for batch, bad_files in self.loader:
                if bad_files:
                    self._set_aside(bad_files)
                if batch is None:  # every file of this batch was skipped
                    # Ranks run one collective per batch: a rank that skipped one would hang the others.
                    sampler = self.sampler
                    if isinstance(sampler, ResumableDistributedSampler) and sampler.num_replicas > 1:
                        raise ConfigError(
                            "data.skip_bad_files",
                            f"a whole batch of {len(bad_files)} files was unreadable (e.g. '{bad_files[0].path}'), "
                            f"and ranks must train the same number of batches; remove the unreadable files",
                        )
                    continue
                yield batch
        finally:
            if self.bad_files and self.rank == 0:
                examples = ", ".join(f"'{bad.path}'" for bad in self.bad_files[:3])
                where = "training epoch" if isinstance(self.sampler, ResumableDistributedSampler) else "evaluation"
                log.warning(
                    f"skipped {len(self.bad_files)} unreadable file(s) in this {where} (data.skip_bad_files=true), "
                    f"e.g. {examples}; first error: {self.bad_files[0].reason}"
                )

    def _set_aside(self, bad_files: list[BadFile]) -> None:
        for bad in bad_files:
            if not bad.skip:
                raise bad.error()
        self.bad_files += bad_files


def collate_setting_aside_bad_files(
    items: list[Any], collate: Callable[[list[Any]], Any] = default_collate
) -> tuple[Any, list[BadFile]]:
    """(`collate` of the readable items, or None if there are none; the BadFiles), so that no exception crosses
    the worker boundary."""
    good = [item for item in items if not isinstance(item, BadFile)]
    bad = [item for item in items if isinstance(item, BadFile)]
    return (collate(good) if good else None), bad
