"""Loaders that shard a split across ranks: two sampler rules, two ways of fetching a batch.

Both loaders share the contract train.py relies on: iterate for batches (tensors: `(inputs, targets)`;
files: what the option's collate makes), `len()` is this rank's batch count of a whole epoch, `num_samples`
this rank's samples per epoch, and `set_epoch(epoch, start_batch)` reshuffles deterministically before each
epoch and skips the batches a resumed run already trained, and `epoch_batches(epoch)` lists an epoch's
batches.

Which rule shards a split: training loaders (`train=True`) use torch's DistributedSampler, the
same number of samples on every rank; evaluation loaders (`train=False`) the exact split, each
sample on exactly one rank. `train` defaults to `shuffle`: a shuffled loader trains, an ordered
one evaluates, which is how build_data asks for them. `train=True, shuffle=False` trains on a
fixed order every epoch (overfitting a few batches while debugging).

Hooks of the data option, for file data (FileLoader): `collate` makes a batch of a list of items (token
sequences pad to the longest), and a `batch_sampler` (a size budget: trainkit.data.size_budget) makes
this rank's batches in place of the fixed-size ones; it keeps the contract above itself. In-memory data
(TensorLoader) stays sliced on the device in fixed batches, targets in their own dtype.

Unreadable files (FileLoader): a dataset item may be a `BadFile` (trainkit.data.imagefolder)
instead of a sample. The worker's collate function sets such items aside, so no exception crosses
the worker boundary; the main process then raises the file's one-line ConfigError, or, where the
dataset skips bad files, trains on the rest of the batch and logs, once per pass over the loader
(an epoch, a validation), how many it skipped: summed over the workers of this rank, logged by
rank 0 for its own shard (the files of other ranks' shards are not added up: that would cost a
collective; the same bad files turn up in rank 0's shard in other epochs).

What a file sample draws (FileLoader): the sampler's indices travel to the workers as (index, seed) pairs
(SeededIndices), the seed a function of (run seed, epoch, index) alone (sample_seed), and the dataset (wrapped by
SeededSamples) seeds torch's global generator, Python's `random` and NumPy's global generator with it before reading
the sample. So a random crop, an augmentation policy or a caption drawn in `__getitem__` (or a transform it calls,
torchvision's included) is the same whichever worker reads it and however many it read before: a resume inside an
epoch, another `data.num_workers` and another number of processes draw the same.
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

from trainkit.data.imagefolder import BadFile
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)


class ResumableDistributedSampler(DistributedSampler):
    """torch's DistributedSampler with `drop_last=True`, plus one thing: `set_epoch(epoch, skip)`
    drops the first `skip` indices of this rank's share of that epoch (a run resumed mid-epoch
    continues exactly where the interrupted one stopped).

    Shuffled, every rank draws the same permutation from `seed + epoch` (so `seed` must be the
    run seed, identical on every rank); unshuffled, the order is range(size) every epoch. Either
    way the order is trimmed to a multiple of `world_size` and rank r takes every world_size-th
    index from r on: the same number of samples, batches and collectives on every rank.
    """

    def __init__(self, size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1):
        # Only len() of the dataset is used: a range keeps the sampler from holding the data.
        # torch's stubs ask for a Dataset, which declares no __len__; a range has what is used.
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
    """Rank r takes `range(size)[r::world_size]`, untrimmed and unpadded: across ranks each
    sample counts exactly once, and shares differ by at most one sample. With a `limit` (samples a
    rank, set_limit), rank r takes the first `limit` of every world_size-th sample from r of one
    permutation drawn from `seed` (the run seed: the same on every rank and every epoch), a seeded
    sample of the split instead of its first files (a folder is listed class by class).

    Why not DistributedSampler here: it gives every rank the same count, padding the last round
    with repeated samples (or dropping the tail with drop_last). Training needs equal counts,
    since every step is a collective (DDP's gradient all-reduce) and a rank with one more batch
    would wait forever. Evaluation reduces once, sums and counts at the end, so unequal shares
    are fine, while a padded duplicate would be counted twice and shift the accuracy.
    """

    def __init__(self, size: int, *, rank: int = 0, world_size: int = 1, seed: int = 0):
        self.size = size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.skip = 0
        self.limit: int | None = None  # samples this rank evaluates; None: its whole share, in order

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.skip = skip  # the same order every epoch

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
        """Reshuffle for `epoch`; `start_batch` > 0 skips the batches a resumed run already trained
        (the rest of the epoch is exactly what the interrupted run would have seen)."""
        self.epoch, self.start_batch = epoch, start_batch
        self.sampler.set_epoch(epoch, skip=start_batch * self.batch_size)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of `epoch` from its first (those a resume skips too), as lists of sample indices,
        whatever epoch the loader is set to: what a mid-epoch checkpoint records (trainkit.checkpointing.epoch_plan)."""
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
        """At most `batches` batches of this rank: an evaluation loader's are a seeded sample of its split, the same
        at every call and disjoint across ranks (EvaluationSampler.set_limit); a training loader's, its first."""
        if not isinstance(self.sampler, EvaluationSampler):
            yield from itertools.islice(self, batches)
            return
        self.sampler.set_limit(batches * self.batch_size)
        try:
            yield from self
        finally:
            self.sampler.set_limit(None)


def limited(loader: Iterable[Any], batches: int | None) -> Iterable[Any]:
    """What an evaluation limited to `batches` batches a process (trainer.limit_val_batches) reads: a seeded sample of
    the split, the same every epoch (ShardedLoader.sample), not its first batches (a folder listed class by class, or
    batches ordered by length, would be one class); a plain iterable (tests), its first. None: the whole loader."""
    if batches is None:
        return loader
    if isinstance(loader, ShardedLoader):
        return loader.sample(batches)
    return itertools.islice(loader, batches)


class TensorLoader(ShardedLoader):
    """A whole split held as two tensors on the device; a batch is one gather (airbench style).

    No DataLoader, no collate, no worker processes: for data that fits in memory this
    removes nearly all per-step overhead. Batches are fresh tensors, safe to modify in place.
    Data too big for the GPU stays on the host (`device=cpu`, possibly a memory-mapped cache) with
    `pin_memory=True`: each batch is gathered whole into pinned memory for an asynchronous copy.
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
        self.labels = labels.to(device)  # their own dtype: class ids, float targets, uint8 bytes (the task casts)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # One host-to-device copy of the epoch's indices, then every batch is a slice of it.
        indices = self.sampler.epoch_indices().to(self.images.device)
        for batch in indices.split(self.batch_size)[: len(self) - self.start_batch]:
            # index_select, not images[batch]: the same gather, several times faster on a CPU.
            images, labels = self.images.index_select(0, batch), self.labels.index_select(0, batch)
            if self.pin_memory:  # held on the host for a GPU: train.py's non_blocking copy overlaps compute
                images, labels = images.pin_memory(), labels.pin_memory()
            yield images, labels


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of what sample `index` draws in `epoch` of a run seeded with `seed`: a 64-bit hash of the three, so
    neighbouring samples and epochs get unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SeededIndices:
    """A sampler (or, `batched`, a batch sampler) whose indices come out as (index, seed) pairs, the seed
    sample_seed(seed, epoch, index) of the `epoch` its FileLoader was last set to: what SeededSamples reads."""

    def __init__(self, indices: Iterable[Any], seed: int, *, batched: bool):
        self.indices, self.seed, self.batched = indices, seed, batched
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.indices)  # type: ignore[arg-type]  # a sampler or batch sampler: sized

    def __iter__(self) -> Iterator[Any]:
        seed, epoch = self.seed, self.epoch  # fixed for the pass, as the sampler's order is

        def pair(index: Any) -> tuple[int, int]:
            return int(index), sample_seed(seed, epoch, int(index))

        if self.batched:
            return ([pair(index) for index in batch] for batch in self.indices)
        return (pair(index) for index in self.indices)


class SeededSamples(Dataset):
    """`dataset`, read by (index, seed) pairs (SeededIndices): torch's global generator, Python's `random` and
    NumPy's global generator are seeded with `seed` before `dataset[index]` is read, so the sample draws the same in
    any worker. In the main process (data.num_workers=0) the three are put back after each batch: the training
    step's own draws (dropout, augmentation on the device) stay where they would be with workers. A plain index
    reads the sample unseeded. Other attributes are the wrapped dataset's (`.samples`, `.transform`, ...)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset has a length

    def __getitem__(self, pair: tuple[int, int] | int) -> Any:
        if not isinstance(pair, tuple):  # a plain index (a test, a script): the sample, its streams as they are
            return self.dataset[pair]
        return self.__getitems__([pair])[0]

    def __getitems__(self, pairs: list[tuple[int, int]]) -> list[Any]:
        """A batch's samples, each read after seeding with its own seed (torch's DataLoader reads a batch so)."""
        if get_worker_info() is not None:  # a worker's streams: nothing of the training step draws from them
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
        if name.startswith("__") or name == "dataset":  # pickling and torch's probes ask the wrapper itself
            raise AttributeError(name)
        return getattr(self.dataset, name)


def seed_global_generators(seed: int) -> None:
    """Seed the generators a sample's code draws from without being handed one: torch's (torchvision's transforms
    use it), Python's `random` and NumPy's (which takes 32 bits)."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class FileLoader(ShardedLoader):
    """A torch DataLoader over files decoded in worker processes, sharded by this module's samplers.

    Batches stay on the CPU (pinned with `pin_memory`; data.pin_memory=auto pins on CUDA) for
    train.py to move with `non_blocking=True`, overlapping the copy with compute. `seed` is the run seed (the same
    on every rank): with the epoch and a sample's index it seeds what the sample draws. `dataset` is the dataset
    as given (the DataLoader reads it through SeededSamples).
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
        prefetch_factor: int = 2,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        train: bool | None = None,
        collate: Callable[[list[Any]], Any] = default_collate,
        batch_sampler: Any = None,
    ):
        size = len(dataset)  # type: ignore[arg-type]  # a map-style dataset has a length; torch's Dataset stub has none
        sampler = shard_sampler(size, train=train, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        super().__init__(sampler, batch_size, drop_last)
        # A batch sampler of the data option's (a size budget) makes this rank's batches in place of the sampler's
        # fixed-size ones; it shards, shuffles and resumes itself (set_epoch(epoch, start_batch), len, num_samples).
        self.batch_sampler = batch_sampler
        # What a sample draws follows from (seed, epoch, index): the seed travels with the index (SeededSamples).
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
            prefetch_factor=prefetch_factor if num_workers > 0 else None,  # batches each worker keeps ready
            pin_memory=pin_memory,
            # DataLoader seeds worker i of this rank (torch, random, numpy) from a base seed drawn from this generator
            # plus i: what draws outside a sample's reading (a collate) differs by worker; a sample's draws do not.
            generator=torch.Generator().manual_seed(seed + rank),
            collate_fn=functools.partial(collate_setting_aside_bad_files, collate=collate),  # the option's collate
        )
        self.rank = rank
        self.bad_files: list[BadFile] = []  # skipped during the current (or last) pass

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.seeded.epoch = epoch
        if self.batch_sampler is None:
            return super().set_epoch(epoch, start_batch)
        self.epoch, self.start_batch = epoch, start_batch
        self.batch_sampler.set_epoch(epoch, start_batch=start_batch)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        if self.batch_sampler is None:
            return super().epoch_batches(epoch)
        self.batch_sampler.set_epoch(epoch, start_batch=0)  # only its contract: set_epoch, then iterate
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
        """As ShardedLoader.sample; a batch sampler of the option's draws its own sample where it can (a token
        budget's `set_limit`: SizeBudgetBatches), else gives its first batches."""
        if self.batch_sampler is None or not isinstance(self.sampler, EvaluationSampler):
            yield from super().sample(batches)
            return
        if not hasattr(self.batch_sampler, "set_limit"):  # a batch sampler of your own that draws none
            yield from itertools.islice(self, batches)
            return
        self.batch_sampler.set_limit(batches)
        try:
            yield from self
        finally:
            self.batch_sampler.set_limit(None)

    def __iter__(self) -> Iterator[Any]:  # what the DataLoader collates: [images, labels]
        self.bad_files = []
        try:
            for batch, bad_files in self.loader:
                if bad_files:
                    self._set_aside(bad_files)
                if batch is None:  # every file of this batch was unreadable and skipped
                    # Training ranks run one collective a batch: a rank that skips one would hang the rest.
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
    """(`collate` of the readable items, or None if there are none; the BadFiles)."""
    good = [item for item in items if not isinstance(item, BadFile)]
    bad = [item for item in items if isinstance(item, BadFile)]
    return (collate(good) if good else None), bad
