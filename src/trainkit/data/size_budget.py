"""Batches filled to a size budget (data.max_<unit>): items of similar size together, so that a batch pads little
and stays within the budget, as many batches every epoch and on every rank (docs/data.md: batches by a token budget).
`FileData.batch_sampler` asks budget_batches for them where the option has a `max_<size_unit>` field (budget_key);
the config check takes the key's rule from config_rules, and its relation to the batch size search from
CONFIG_RELATIONS (conf/config.yaml's `_checks_.size_budget`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset

from trainkit.config.schema import Check, Relation, integer
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from trainkit.data.datasets import Data
    from trainkit.data.file_data import FileData

BUCKET_RATIO = 1.1  # a bucket's longest item is at most this times its shortest ...
BUCKET_SLACK = 8  # ... or at most this many units longer (short items would make tiny buckets)


class SizeBudgetBatches:
    """This rank's batches of indices whose padded size fits `budget`, given one size per item in `unit`s."""

    def __init__(
        self,
        sizes: torch.Tensor | Sequence[int],
        budget: int,
        max_batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        train: bool | None = None,
        unit: str = "tokens",
    ):
        sizes = torch.as_tensor(sizes, dtype=torch.int64)
        self.unit, self.key = unit, f"data.max_{unit}"
        longest = int(sizes.max()) if len(sizes) else 0
        if longest > budget:
            raise ConfigError(
                self.key,
                f"is {budget}, but a sequence holds {longest} {unit} and no batch could hold it; "
                f"raise {self.key} to at least {longest}, or cut the sequences shorter",
            )
        self.budget, self.max_batch_size = budget, max_batch_size
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.train = shuffle if train is None else train
        self.drop_last = drop_last
        self.buckets = _buckets(sizes, budget, max_batch_size)
        self.epoch, self.start_batch = 0, 0
        self.limit: int | None = None
        self._batches: list[list[int]] | None = None
        if self.train and len(sizes) > 0 and self.total_batches() < world_size:
            raise self._too_few_batches(sizes)

    def total_batches(self) -> int:
        """The batches of an epoch on all ranks, before training cuts them to a multiple of world_size."""
        return _count(self.buckets, self.drop_last)

    def _too_few_batches(self, sizes: torch.Tensor) -> ConfigError:
        """The error for fewer batches than processes, suggesting the largest halved cap that makes enough."""
        total, ranks = self.total_batches(), self.world_size
        sequences = f"{len(sizes)} sequence{'s' if len(sizes) != 1 else ''}"
        cap = self.max_batch_size // 2
        while cap > 1 and _count(_buckets(sizes, self.budget, cap), self.drop_last) < ranks:
            cap //= 2
        enough = cap >= 1 and _count(_buckets(sizes, self.budget, cap), self.drop_last) >= ranks
        fix = (
            f"data.batch_size={cap} (the most sequences in one batch) or a lower {self.key}, or train with fewer "
            f"processes"
            if enough
            else f"train with fewer processes ({sequences} cannot make {ranks} batches)"
        )
        dropped = " (data.drop_last=true drops each length bucket's last, partial batch)" if self.drop_last else ""
        return ConfigError(
            self.key,
            f"{self.budget} {self.unit} a batch (data.batch_size={self.max_batch_size} sequences at most) make "
            f"{total} training batch{'es' if total != 1 else ''} of the {sequences}{dropped}, fewer than "
            f"the {ranks} processes: each trains as many batches, so the list is cut to a multiple of {ranks}, which "
            f"leaves none; make at least {ranks}: {fix}",
        )

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch, self._batches = epoch, start_batch, None

    def set_limit(self, batches: int | None) -> None:
        """Evaluation only: a seeded sample of `batches` per rank, the same every epoch; None: every batch."""
        assert not self.train, "a training epoch is limited by trainer.limit_train_batches, in train.py"
        self.limit, self._batches = batches, None

    def batches(self) -> list[list[int]]:
        """This rank's whole epoch of batches, before skipping start_batch."""
        if self._batches is None:
            self._batches = self._rank_share(self._epoch_batches())
        return self._batches

    def _epoch_batches(self) -> list[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        elif self.limit is not None:
            generator = torch.Generator().manual_seed(self.seed)
        else:
            generator = None
        batches = []
        for indices, size in self.buckets:
            members = indices[torch.randperm(len(indices), generator=generator)] if generator else indices
            parts = list(members.split(size))
            if self.drop_last and len(parts[-1]) < size:
                parts.pop()
            batches += [part.tolist() for part in parts]
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        return batches

    def _rank_share(self, batches: list[list[int]]) -> list[list[int]]:
        if self.train:
            batches = batches[: len(batches) - len(batches) % self.world_size]
        elif self.limit is not None:
            batches = batches[: self.limit * self.world_size]
        return batches[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches()[self.start_batch :])

    def __len__(self) -> int:
        total = self.total_batches()
        if self.train:
            return total // self.world_size
        share = len(range(self.rank, total, self.world_size))
        return share if self.limit is None else min(share, self.limit)

    @property
    def num_samples(self) -> int:
        """This rank's samples in the current epoch, including batches a resume skips."""
        return sum(len(batch) for batch in self.batches())


def _count(buckets: list[tuple[torch.Tensor, int]], drop_last: bool) -> int:
    """The batches `buckets` make on all ranks."""
    return sum(len(indices) // size if drop_last else -(-len(indices) // size) for indices, size in buckets)


def _buckets(sizes: torch.Tensor, budget: int, max_batch_size: int) -> list[tuple[torch.Tensor, int]]:
    """(indices sorted by size, items per batch) of each bucket, smallest bucket first."""
    order = torch.sort(sizes, stable=True).indices  # stable: the same buckets on every machine
    sorted_lengths = sizes[order].tolist()
    buckets, start = [], 0
    while start < len(order):
        shortest = max(sorted_lengths[start], 1)
        limit = max(shortest * BUCKET_RATIO, shortest + BUCKET_SLACK)
        end = start
        while end < len(order) and sorted_lengths[end] <= limit:
            end += 1
        longest = max(sorted_lengths[end - 1], 1)
        buckets.append((order[start:end], max(1, min(max_batch_size, budget // longest))))
        start = end
    return buckets


def budget_key(data: type[Data]) -> str | None:
    """The key of a data option's size budget, max_<its size_unit>, if it has one."""
    key = f"max_{data.size_unit}" if data.size_unit else None
    return key if key in {field.name for field in dataclasses.fields(data)} else None


def budget_batches(
    data: FileData, dataset: Dataset, train: bool, seed: int, rank: int, world_size: int
) -> SizeBudgetBatches | None:
    """This rank's batches of a file split filled to data.max_<size_unit>; None without a budget (fixed batches)."""
    key = budget_key(type(data))
    budget = getattr(data, key, None) if key else None
    if budget is None:
        return None
    sizes = data.item_sizes(dataset)
    if sizes is None:
        raise ConfigError(
            f"data.{key}",
            f"is set, but {type(dataset).__name__} declares no item sizes to batch by; give it `sizes` (one "
            f"number per item, in {data.size_unit}) or set data.{key}=null",
        )
    return SizeBudgetBatches(
        sizes,
        budget,
        data.batch_size if train else data.eval_batch_size,
        shuffle=data.shuffle and train,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=data.drop_last and train,
        train=train,
        unit=str(data.size_unit),
    )


def config_rules(cfg: DictConfig) -> dict[str, Check]:
    """The rule of data.max_<unit> (data.max_tokens, data.max_frames): a whole number >= 1, or null."""
    from trainkit.config.validation import configured_data_class

    data = configured_data_class(cfg)
    key = budget_key(data) if data is not None else None
    return {f"data.{key}": integer(1, null=True)} if key else {}


def _the_batch_size_is_not_searched(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """The batch size finder searches data.batch_size; under a size budget that only caps a batch's items."""
    from trainkit.config.validation import configured_data_class

    data = configured_data_class(cfg)
    key = budget_key(data) if data is not None else None
    if key and isinstance(cfg.data.get(key), int) and OmegaConf.select(cfg, "batch_size_finder.enabled") is True:
        yield (
            "batch_size_finder.enabled",
            f"searches data.batch_size, but data.{key}={cfg.data[key]} decides how much a batch holds "
            "(data.batch_size only caps its items); set batch_size_finder.enabled=false and size the budget "
            f"(or trainer.micro_batch_size=auto under it), or set data.{key}=null to search fixed batches",
        )


CONFIG_RELATIONS = (Relation(("data._target_", "batch_size_finder.enabled"), _the_batch_size_is_not_searched),)
