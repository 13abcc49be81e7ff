"""Data read from files (or rows) in DataLoader workers: a data option that subclasses FileData returns FileSplits
of torch datasets, and FileLoader batches them on the CPU, sharded by the core's samplers
(trainkit.data.loaders). What a sample draws follows from (seed, epoch, index), whatever worker reads it, after a
resume too; unreadable files are named, or skipped and counted (docs/data.md#data-read-from-files).
`python scripts/trim.py --drop file_data` removes this module; the core then loads in-memory tensors only.
"""

import functools
import hashlib
import itertools
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from trainkit.config.schema import Check, auto_or, flag, integer
from trainkit.data.datasets import Data
from trainkit.data.fingerprint import digest_of
from trainkit.data.loaders import EvaluationSampler, ResumableDistributedSampler, ShardedLoader, shard_sampler
from trainkit.distributed.process_group import process_info
from trainkit.errors import ConfigError
from trainkit.runtime import this_rank_cores

log = logging.getLogger(__name__)
SKIP_HINT = "fix or remove it, or pass data.skip_bad_files=true to skip unreadable images (counted in the log)"


@dataclass(frozen=True)
class BadFile:
    """What the dataset returns for a file Pillow cannot read: picklable, for FileLoader to raise or skip."""

    path: str
    reason: str
    skip: bool  # data.skip_bad_files

    def error(self) -> ConfigError:
        return ConfigError("data.root", f"cannot read image '{self.path}' ({self.reason}); {SKIP_HINT}")


@dataclass
class FileSplits:
    """Datasets decoded in DataLoader workers; data.channels and data.image_size say their shape."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int

    def fingerprints(self) -> dict:
        """Each split's part of the data fingerprint: its files and labels (its `samples`), else its size."""
        made: dict[str, Any] = {"train": self.train, "val": self.val, "test": self.test}
        if not all(hasattr(dataset, "samples") for dataset in made.values()):
            return {name: {"files": len(dataset)} for name, dataset in made.items()}
        top = os.path.commonpath([path for dataset in made.values() for path, _ in dataset.samples])
        return {
            name: {"files": len(dataset.samples), "digest": digest_of(relative_path_label_rows(dataset.samples, top))}
            for name, dataset in made.items()
        }


def relative_path_label_rows(samples: Iterable[tuple[str, int]], top: str) -> list[str]:
    return [f"{os.path.relpath(path, top) if top else path}\t{label}" for path, label in samples]


def split_files_change(name: str, saved: dict, now: dict) -> str | None:
    """What differs between two fingerprints of the `name` split by its files (fingerprints()), or None."""
    added = now["files"] - saved["files"]
    if added:
        return f"{abs(added)} files {'added to' if added > 0 else 'removed from'} the {name} split"
    if saved.get("digest") != now.get("digest"):
        return f"the {name} split holds other files (as many, renamed, relabelled or moved between splits)"
    return None


def read_files_changes(before: dict | None, now: dict | None) -> list[str]:
    """What differs between two data identities' `files` (each file's bytes and sha256, where an option lists the
    files it read), one phrase each."""
    if before is None or now is None:
        return []
    added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
    changes = [f"{', '.join(added)} read, not read before"] if added else []
    changes += [f"{', '.join(removed)} read before, not now"] if removed else []
    for name in sorted(set(now) & set(before)):
        first, second = before[name] or {}, now[name] or {}
        if first.get("bytes") != second.get("bytes"):
            changes.append(f"{name} is {second.get('bytes'):,} bytes, was {first.get('bytes'):,}")
        elif first.get("sha256") and second.get("sha256") and first["sha256"] != second["sha256"]:
            changes.append(
                f"the contents of {name} differ (the same name and size; sha256 {second['sha256'][:12]}, was "
                f"{first['sha256'][:12]})"
            )
    return changes


@dataclass(kw_only=True)
class FileData(Data):
    """A data option whose splits() returns FileSplits, read in `num_workers` worker processes per rank."""

    prefetch_factor: int = 2  # batches each worker keeps ready
    pin_memory: bool | str = "auto"  # auto: on with CUDA

    in_memory: ClassVar[bool] = False
    config_rules: ClassVar[dict[str, Check]] = {"prefetch_factor": integer(1), "pin_memory": auto_or(flag())}

    def loaders(self, made: Any, device: torch.device, train: dict, evaluation: dict) -> list[ShardedLoader]:
        if not isinstance(made, FileSplits):
            raise ConfigError(
                "data._target_",
                f"{type(self).__name__}.splits() returned {type(made).__name__}, but the class reads files in "
                f"workers (FileData); return trainkit.data.file_data.FileSplits, or derive the class from Data "
                f"for tensors held in memory",
            )
        files = {**file_loader_settings(self, device), "collate": self.collate}
        shards = {key: train[key] for key in ("seed", "rank", "world_size")}
        return [
            FileLoader(split, **args, **files, batch_sampler=self.batch_sampler(split, train=trains, **shards))
            for split, args, trains in (
                (made.train, train, True),
                (made.val, evaluation, False),
                (made.test, evaluation, False),
            )
        ]

    def identity(self, made: Any) -> dict:
        """Every file of the three splits and its label (their `samples`), in no order; else how many items."""
        splits = [made.train, made.val, made.test]
        if not all(hasattr(split, "samples") for split in splits):
            return {"samples": sum(len(split) for split in splits)}
        samples = [(str(sample[0]), sample[1]) for split in splits for sample in split.samples]
        top = os.path.commonpath([path for path, _ in samples]) if samples else ""
        rows = sorted(relative_path_label_rows(samples, top))
        return {"samples": len(rows), "digest": digest_of(rows)}

    def longest_item(self, made: Any) -> int | None:
        sizes = self.item_sizes(made.train)
        return int(max(sizes)) if sizes is not None and len(sizes) else None

    def collate(self, items: list[Any]) -> Any:
        """A batch from a list of file-split items, made in the loader's workers."""
        return default_collate(items)

    def item_sizes(self, dataset: Dataset) -> Sequence[int] | None:
        """Each item's size in `size_unit`s (the dataset's `sizes`), or None where it declares none."""
        return getattr(dataset, "sizes", None)

    def batch_sampler(self, dataset: Dataset, *, train: bool, seed: int, rank: int, world_size: int) -> Any:
        """This rank's batches of a file split as lists of indices, or None: the loaders' own fixed batches."""
        from trainkit.data.size_budget import budget_batches  # feature: size_budget

        return budget_batches(self, dataset, train, seed, rank, world_size)  # feature: size_budget


def file_loader_settings(data: FileData, device: torch.device) -> dict:
    """FileLoader's worker count, pinning and prefetch, by the loader rules of docs/speed.md#the-loader-rules; rank 0
    logs what `auto` chose."""
    settings = dict(
        num_workers=resolve_num_workers(data.num_workers),
        pin_memory=resolve_pin_memory(data.pin_memory, device),
        prefetch_factor=data.prefetch_factor,
    )
    if process_info().is_main:
        log.info(settings_line(settings, data.num_workers, data.pin_memory))
    return settings


def resolve_num_workers(value: int | str) -> int:
    """`auto`: the cores this rank may use; a number is used as given."""
    return this_rank_cores() if value == "auto" else int(value)


def resolve_pin_memory(value: bool | str, device: torch.device) -> bool:
    """`auto`: pinned on CUDA, where non_blocking copies then overlap compute; elsewhere pinning buys nothing."""
    return device.type == "cuda" if value == "auto" else bool(value)


def settings_line(settings: dict, num_workers: int | str, pin_memory: bool | str) -> str:
    """e.g. `data: 8 workers per rank, pinned (data.num_workers=auto, data.pin_memory=auto)`."""
    workers = settings["num_workers"]
    count = f"{workers} worker{'s' * (workers != 1)} per rank" if workers else "no workers (decoded in this process)"
    pinned = "pinned" if settings["pin_memory"] else "not pinned"
    return f"data: {count}, {pinned} (data.num_workers={num_workers}, data.pin_memory={str(pin_memory).lower()})"


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
