"""k-fold cross-validation (data.folds, data.fold: docs/data.md#k-fold-cross-validation-datafolds-datafold), reached
from Data.cut_val and Data.own_val's marked lines; conf/config.yaml's `_checks_.folds` gathers its checks."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from trainkit.config.schema import Check, Relation, integer
from trainkit.errors import ConfigError

if TYPE_CHECKING:  # datasets.py imports this module (its marked lines): a run-time import back would be a cycle
    from trainkit.data.datasets import Data

log = logging.getLogger(__name__)


def folded(
    parts: dict[str, torch.Tensor],
    folds: int | None,
    fold: int | None,
    seed: int,
    labels: Any = None,
    names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """`parts` with train and val pooled, cut into `folds` folds by `seed` (by class with `labels`): fold `fold` is
    "val", the rest "train", test as it was. `folds` None: `parts` itself."""
    if folds is None:
        return parts
    pool = torch.cat([torch.as_tensor(parts["train"]), torch.as_tensor(parts["val"])]).sort().values
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    if labels is not None:  # class by class, so that each fold holds each class
        order = order[torch.sort(torch.as_tensor(labels)[pool][order], stable=True).indices]
    if len(pool) < folds:
        raise ConfigError("data.folds", f"is {folds}, but the training pool holds {len(pool)} samples; lower it")
    if labels is not None:
        _refuse_a_class_in_fewer_samples_than_folds(torch.as_tensor(labels)[pool], folds, names)
    in_fold = torch.empty(len(pool), dtype=torch.int64)
    in_fold[order] = torch.arange(len(pool)) % folds
    made = {**parts, "train": pool[in_fold != fold], "val": pool[in_fold == fold]}
    log.info(
        "val fold %d of %d (data.folds, data.fold): %d of the %d samples of train and val, cut by seed %d%s",
        fold, folds, len(made["val"]), len(pool), seed, ", by class" if labels is not None else "",
    )  # fmt: skip
    return made


def _refuse_a_class_in_fewer_samples_than_folds(pool_labels: torch.Tensor, folds: int, names: Any) -> None:
    from trainkit.data.datasets import class_name

    values, counts = pool_labels.unique(return_counts=True)
    if len(counts) and counts.min() < folds:
        smallest = int(counts.argmin())
        label, count = int(values[smallest]), int(counts[smallest])
        raise ConfigError(
            "data.folds",
            f"is {folds}, but {class_name(label, names)} has {count} sample{'s' if count != 1 else ''} in the "
            f"training pool (train and val together): {folds - count} of the folds would validate without it; "
            f"lower data.folds to {count} or fewer, or add samples of that class",
        )


def refuse_own_val(data: Data, where: str, instead: str) -> None:
    if data.folds is not None:
        raise ConfigError(
            "data.folds",
            f"is {data.folds}, but {where} is a val split of its own: folds are cut from the training data alone and "
            f"one of them is val; remove data.folds, or {instead}",
        )


def fold_name(data: Data) -> str | None:
    """The fold for the data fingerprint ("fold 2 of 5"), so a resume into another fold is refused."""
    return None if data.folds is None else f"fold {data.fold} of {data.folds}"


CONFIG_RULES: dict[str, Check] = {"data.folds": integer(2, null=True), "data.fold": integer(0, null=True)}


def _folds(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """data.folds and data.fold go together, the fold one of the folds, on a class that carves val (`val_fraction`)."""
    from trainkit.data.datasets import data_class

    folds, fold = cfg.data.get("folds"), cfg.data.get("fold")
    given = [key for key, value in (("folds", folds), ("fold", fold)) if value is not None]
    try:
        data = data_class(str(cfg.data.get("_target_")))
    except ConfigError:
        return  # the core's check of data._target_ says why
    if given and "val_fraction" not in {field.name for field in dataclasses.fields(data)}:
        yield f"data.{given[0]}", not_taken(data, cfg.data._target_, [f"data.{key}=..." for key in given])
    elif folds is not None and fold is None:
        yield (
            "data.fold",
            f"is null, but data.folds={folds}; pick the val fold, data.fold=0..{folds - 1} "
            f"(every fold: -m data.folds={folds} 'data.fold=range({folds})')",
        )
    elif fold is not None and folds is None:
        yield (
            "data.fold",
            f"is {fold}, but data.folds is null; set data.folds=K (the number of folds, K >= {max(2, fold + 1)})",
        )
    elif fold is not None and fold >= folds:
        yield "data.fold", f"is {fold}, but data.folds={folds} numbers the folds 0..{folds - 1}; pick one of them"


def not_taken(data: type, target: str, removals: list[str]) -> str:
    return (
        f"is k-fold cross-validation's, which {data.__name__} ({target}) does not take: it carves no val split from "
        f"training data; remove {' and '.join(removals)} (or, for a class of yours that carves val, give it a "
        f"val_fraction field and cut val with Data.cut_val: docs/data.md)"
    )


CONFIG_RELATIONS = (Relation(("data._target_", "data.folds", "data.fold"), _folds),)
