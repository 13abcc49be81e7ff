"""RULES: what each key of the config may hold (type, range, choices), one line per key, in the words of
trainkit.config.schema. A new config option gets its rule here; keys that contradict each other are
trainkit.config.validation's RELATIONS; a model's arguments and a feature's keys are checked beside their code."""

import re
from collections.abc import Mapping

from omegaconf import ListConfig, OmegaConf

from trainkit.config.schema import Check, auto_or, flag, integer, number, numbers, one_of, show, string
from trainkit.runtime import PRECISIONS
from trainkit.tracking.loggers import trackers

# A feature's augmentation keys beside these: the modules its `_checks_` names check them (docs/features.md).
AUGMENTATION_KEYS = ("name", "crop_padding", "horizontal_flip", "_checks_")


def device_name(value: object) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        return None
    return f"{value!r} is not a device; use auto, cpu, cuda, cuda:N or mps"


def split_fraction(split: str, uses: str) -> Check:
    """data.val_fraction, data.test_fraction: 0 is refused with what to do instead, as every run needs the split."""
    fraction = number(above=0, below=1)

    def check(value: object) -> str | None:
        if value == 0 and not isinstance(value, bool):
            return (
                f"is 0, but every run needs a {split} split ({uses}); to train on nearly every image set a small "
                f"fraction (e.g. data.{split}_fraction=0.02), or give an image folder a {split}/ folder of its own "
                f"(data.root/{split}/<class>/, a few images each: then nothing is carved from train/)"
            )
        return fraction(value)

    return check


def required_keys(value: object) -> str | None:
    """Entries of `required`: a key, or a list of keys of which one must be given."""
    if isinstance(value, ListConfig) and all(isinstance(entry, str) or OmegaConf.is_list(entry) for entry in value):
        return None
    return f"must be a list of keys (an entry may be a list of alternatives), got {show(value)}"


def tracker_choice(value: object) -> str | None:
    """logger.trackers: {name: true/false}, a name for each module of trainkit.tracking.loggers."""
    names = ", ".join(trackers())
    if not isinstance(value, Mapping) or any(not isinstance(on, bool) for on in value.values()):
        return f"must map tracker names ({names}) to true or false; pick them with logger=<name> or logger=[a,b]"
    unknown = [str(name) for name in value if name != "none" and name not in trackers()]
    return f"unknown tracker {', '.join(unknown)}; the trackers are {names}" if unknown else None


RULES: dict[str, Check] = {
    "seed": integer(0),
    "device": device_name,
    "resume": string(null=True),
    "print_config": flag(),
    "optimized_metric": string(null=True),  # val/<metric> or test/<metric> of the task (null: filled in from the task)
    "required": required_keys,
    "trainer.max_epochs": integer(1),
    "trainer.max_steps": integer(1, null=True),
    "trainer.accumulate_grad_batches": integer(1),
    "trainer.micro_batch_size": integer(1, null=True),  # N samples (units: tokens) a part; null: whole batches
    "trainer.grad_clip": number(above=0, null=True),
    "trainer.log_every_n_steps": integer(1),
    "trainer.checkpoint_every_n_steps": integer(1, null=True),
    "trainer.limit_train_batches": integer(1, null=True),
    "trainer.limit_val_batches": integer(1, null=True),
    "trainer.channels_last": flag(),
    "trainer.compile": flag(),
    "trainer.cudnn_benchmark": flag(),
    "trainer.deterministic": flag(),
    "trainer.progress_bar": flag(),
    "data._target_": string(),  # the data class; trainkit.config.validation imports it to read its keys and needs
    "task._target_": string(),  # the task class; trainkit.config.validation imports it to read its metric names
    "data.name": string(),  # a label: the option's file (data=<name>) and _target_ decide what loads
    "data.root": string(null=True),
    "data.download": flag(),
    "data.channels": integer(1),
    "data.image_size": integer(1),
    "data.num_classes": integer(1, null=True),  # the model's outputs: 1 for a regression
    "data.mirror_changes_label": flag(),
    "data.mean": numbers(),
    "data.std": numbers(above=0),
    "data.val_fraction": split_fraction("val", "early stopping, best.pt and the val/ metrics read it"),
    "data.test_fraction": split_fraction("test", "summary.json's test metrics"),
    "data.split_seed": integer(0),
    "data.batch_size": integer(1),
    "data.eval_batch_size": integer(1),
    "data.num_workers": auto_or(integer(0)),
    "data.drop_last": flag(),
    "data.shuffle": flag(),
    "optimizer.lr": number(above=0),
    "optimizer.weight_decay": number(0),
    "optimizer.momentum": number(0, 1),
    "optimizer.nesterov": flag(),
    "optimizer.betas": numbers(0, below=1, length=2),
    "optimizer.eps": number(above=0),
    "optimizer.fused": auto_or(flag()),
    "optimizer.head_lr_scale": number(0),
    "optimizer.scale_lr_with_batch": flag(),
    "optimizer.reference_batch_size": integer(1),
    "precision.name": one_of(*PRECISIONS),
    "precision.tf32": flag(),
    "regularization.label_smoothing": number(0, 0.99),
    "regularization.dropout": number(0, 0.99),
    "regularization.early_stopping.enabled": flag(),
    # val/<metric> of the task's: a relation in trainkit.config; null (and the mode null): the task's headline metric
    "regularization.early_stopping.monitor": string(null=True),
    "regularization.early_stopping.mode": one_of("min", "max", null=True),
    "regularization.early_stopping.patience": integer(1),
    "regularization.early_stopping.min_delta": number(0),
    # A missing or null augmentation key means "off".
    "augmentation.name": string(),  # a label: the keys decide what runs (a conf/augmentation/<name>.yaml of yours too)
    "augmentation.crop_padding": number(0, 0.5, null=True),
    "augmentation.horizontal_flip": flag(null=True),
    "distributed.name": string(),  # none, ddp, or a strategy's own that distributed.parallel names (validation)
    "distributed.parallel": string(null=True),  # module.Class: trainkit.distributed.parallel.strategy
    "distributed.nproc_per_node": integer(1, null=True),
    "distributed.backend": one_of("auto", "nccl", "gloo"),
    "distributed.sync_batchnorm": flag(),
    "distributed.timeout_seconds": number(above=0),
    "logger.trackers": tracker_choice,
}
