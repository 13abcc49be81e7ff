"""Check the composed config in one pass, from one schema, before any data or model is built.

RULES says what each key may hold (type, range, choices); RELATIONS catch keys that contradict
each other; `???` keys still missing are required. Every problem the config alone reveals is
found in the same pass, so a typo costs a second, not a run, and one try shows them all:

    error: data.batch_size: must be a whole number >= 1, got 0; also optimizer.lr: must be ...

What only files or the built model can reveal (a missing data folder, a timm name that does not
exist, weights of another shape) is checked where it arises, in the same one-line form.
`ignored_keys` lists settings the chosen options do not use: warnings, not errors.
"""

import logging
import re
from collections.abc import Iterator

import torch
from omegaconf import DictConfig, OmegaConf

from trainkit.augment import active_ops
from trainkit.data import DATASETS, IN_MEMORY
from trainkit.distributed import process_info
from trainkit.errors import ConfigError
from trainkit.loggers import LOGGERS, WANDB_MODES
from trainkit.optim import SCHEDULES
from trainkit.runtime import PRECISIONS
from trainkit.schema import (
    Check,
    Relation,
    find_problems,
    flag,
    integer,
    interval,
    number,
    numbers,
    one_of,
    section,
    show,
    text,
    unknown_keys,
)

log = logging.getLogger(__name__)

METRICS = ("val/acc", "val/loss")
OPTIMIZED_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")
NEEDS_NO_FILES = ("digits", "synthetic")  # generated or shipped with a package: data.root means nothing
DOWNLOADABLE = ("mnist", "cifar10")  # torchvision fetches these when data.download=true
# augmentation.name is a label (the keys decide what runs), but a closed list catches typos:
# add yours here when you add a conf/augmentation/<name>.yaml.
AUGMENTATIONS = ("none", "shift", "basic", "strong")
AUGMENTATION_KEYS = ("name", "crop_padding", "horizontal_flip", "color_jitter", "affine", "random_order")
COLOR_JITTER_KEYS = ("brightness", "contrast", "saturation")
AFFINE_KEYS = ("degrees", "translate", "scale", "shear")


def device_name(value) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        return None
    return f"{value!r} is not a device; use auto, cpu, cuda, cuda:N or mps"


def freeze_spec(value) -> str | None:
    if value is None or value == "backbone" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return f"must be null, backbone or a number of stages >= 0, got {show(value)}"


def required_keys(value) -> str | None:
    """Entries of `required`: a key, or a list of keys of which one must be given."""
    if OmegaConf.is_list(value) and all(isinstance(entry, str) or OmegaConf.is_list(entry) for entry in value):
        return None
    return f"must be a list of keys (an entry may be a list of alternatives), got {show(value)}"


RULES: dict[str, Check] = {
    "seed": integer(0),
    "device": device_name,
    "resume": text(null=True),
    "print_config": flag(),
    "optimized_metric": one_of(*OPTIMIZED_METRICS),
    "required": required_keys,
    "sweep.catch_failures": flag(),
    "sweep.failed_trial_value": number(null=True),
    "trainer.max_epochs": integer(1),
    "trainer.max_steps": integer(1, null=True),
    "trainer.accumulate_grad_batches": integer(1),
    "trainer.grad_clip": number(above=0, null=True),
    "trainer.log_every_n_steps": integer(1),
    "trainer.checkpoint_every_n_steps": integer(1, null=True),
    "trainer.limit_train_batches": integer(1, null=True),
    "trainer.limit_val_batches": integer(1, null=True),
    "trainer.channels_last": flag(),
    "trainer.compile": flag(),
    "trainer.progress_bar": flag(),
    "data.name": one_of(*DATASETS),
    "data.root": text(null=True),
    "data.download": flag(),
    "data.channels": integer(1),
    "data.image_size": integer(1),
    "data.num_classes": integer(2, null=True),
    "data.mean": numbers(),
    "data.std": numbers(above=0),
    "data.val_fraction": number(above=0, below=1),
    "data.test_fraction": number(above=0, below=1),
    "data.split_seed": integer(0),
    "data.num_samples": integer(1),
    "data.val_samples": integer(1),
    "data.test_samples": integer(1),
    "data.noise": number(0),
    "data.batch_size": integer(1),
    "data.eval_batch_size": integer(1),
    "data.num_workers": integer(0),
    "data.drop_last": flag(),
    "data.shuffle": flag(),
    "model.name": text(),
    "model.pretrained": flag(),
    "model.pretrained_path": text(null=True),
    "model.input_size": integer(1, null=True),
    "model.freeze": freeze_spec,
    "model.freeze_bn": flag(),
    "model.widths": numbers(1, whole=True),
    "model.drop_path_rate": number(0, below=1),
    "optimizer.lr": number(above=0),
    "optimizer.weight_decay": number(0),
    "optimizer.momentum": number(0, 1),
    "optimizer.nesterov": flag(),
    "optimizer.betas": numbers(0, below=1, length=2),
    "optimizer.eps": number(above=0),
    "optimizer.head_lr_scale": number(0),
    "optimizer.scale_lr_with_batch": flag(),
    "optimizer.reference_batch_size": integer(1),
    "scheduler.name": one_of(*SCHEDULES),
    "scheduler.warmup_epochs": number(0),
    "scheduler.warmup_start_factor": number(0, 1, null=True),
    "scheduler.min_lr_ratio": number(0, 1),
    "scheduler.cycle_epochs": number(above=0),
    "scheduler.cycle_mult": integer(1),
    "scheduler.step_epochs": number(above=0),
    "scheduler.gamma": number(0, 1),
    "precision.name": one_of(*PRECISIONS),
    "regularization.label_smoothing": number(0, 0.99),
    "regularization.dropout": number(0, 0.99),
    "regularization.early_stopping.enabled": flag(),
    "regularization.early_stopping.monitor": one_of(*METRICS),
    "regularization.early_stopping.mode": one_of("min", "max"),
    "regularization.early_stopping.patience": integer(1),
    "regularization.early_stopping.min_delta": number(0),
    # A missing or null augmentation key means "off".
    "augmentation.name": one_of(*AUGMENTATIONS),
    "augmentation.crop_padding": number(0, 0.5, null=True),
    "augmentation.horizontal_flip": flag(null=True),
    "augmentation.color_jitter": section(COLOR_JITTER_KEYS),
    **{f"augmentation.color_jitter.{key}": number(0, null=True) for key in COLOR_JITTER_KEYS},
    "augmentation.affine": section(AFFINE_KEYS),
    "augmentation.affine.degrees": number(0, below=90, null=True),
    "augmentation.affine.translate": number(0, 1, null=True),
    "augmentation.affine.scale": interval(above=0, null=True),
    "augmentation.affine.shear": number(0, below=90, null=True),
    "augmentation.random_order": flag(null=True),
    "lr_finder.enabled": flag(),
    "lr_finder.apply": flag(),
    "lr_finder.min_lr": number(above=0),
    "lr_finder.max_lr": number(above=0),
    "lr_finder.num_steps": integer(2),
    "lr_finder.smoothing": number(0, below=1),
    "lr_finder.divergence_factor": number(above=1),
    "batch_size_finder.enabled": flag(),
    "batch_size_finder.start": integer(1),
    "batch_size_finder.max_batch_size": integer(1),
    "batch_size_finder.safety_margin": number(above=0, maximum=1),
    "batch_size_finder.memory_cap_gb": number(above=0, null=True),
    "distributed.name": one_of("none", "ddp"),
    "distributed.nproc_per_node": integer(1, null=True),
    "distributed.backend": one_of("auto", "nccl", "gloo"),
    "distributed.sync_batchnorm": flag(),
    "distributed.timeout_seconds": number(above=0),
    "logger.name": one_of(*LOGGERS),
    "logger.mode": one_of(*WANDB_MODES),
    "logger.filename": text(),
    "logger.project": text(),
    "logger.log_images": flag(),
    "logger.init_timeout": number(above=0),
}


# ---- relations: keys that contradict each other --------------------------------------------


def _required(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """An experiment lists in `required` the keys it cannot run without (null or false: not given).
    A `???` in the experiment cannot say it when a group set the key first: merging `???` over a
    value keeps the value."""
    for entry in cfg.required:
        keys = [entry] if isinstance(entry, str) else list(entry)
        values = [OmegaConf.select(cfg, key, default=KeyError) for key in keys]
        if KeyError in values:
            yield "required", f"names {keys[values.index(KeyError)]}, which is not a key of this config"
        elif all(value in (None, False) for value in values):
            others = "".join(
                f" (or {key}={'true' if value is False else '...'})" for key, value in zip(keys[1:], values[1:])
            )
            yield keys[0], f"is required; pass {keys[0]}=...{others}"


def _statistics_per_channel(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    for key in ("mean", "std"):
        if len(cfg.data[key]) not in (1, cfg.data.channels):
            yield (
                f"data.{key}",
                (
                    f"has {len(cfg.data[key])} values for data.channels={cfg.data.channels}; "
                    f"give one per channel, or one for all"
                ),
            )


def _dataset_needs(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """What the chosen dataset needs from the other data keys."""
    data = cfg.data
    if data.name not in NEEDS_NO_FILES and data.get("root") is None:
        where = "a folder holding train/<class>/<images>" if data.name == "imagefolder" else "the data folder"
        yield "data.root", f"is required for {data.name}; pass data.root=... ({where})"
    if data.name == "imagefolder" and data.channels not in (1, 3):
        yield (
            "data.channels",
            f"is {data.channels}, but images decode as greyscale (1) or RGB (3); set data.channels=1 or 3",
        )
    if data.name == "synthetic" and data.get("num_classes") is None:
        yield "data.num_classes", "is null, but synthetic data generates its classes; set data.num_classes=N"
    fractions = [key for key in ("val_fraction", "test_fraction") if data.get(key) is not None]
    if sum(data[key] for key in fractions) >= 1:
        keys = " + ".join(f"data.{key}" for key in fractions)
        yield (
            f"data.{fractions[0]}",
            f"{keys} = {sum(data[key] for key in fractions):g} leaves no training samples; lower them",
        )


def _pretrained_once(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.model.get("pretrained_path") and cfg.model.get("pretrained"):
        yield (
            "model.pretrained_path",
            (
                "is set together with model.pretrained=true; load weights one way: "
                "set model.pretrained=false to use the file"
            ),
        )


def _nesterov_needs_momentum(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.optimizer.get("nesterov") and not cfg.optimizer.get("momentum"):
        yield "optimizer.nesterov", "needs optimizer.momentum > 0; set a momentum or optimizer.nesterov=false"


def _early_stopping_direction(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    stopping = cfg.regularization.early_stopping
    wanted = "max" if stopping.monitor.endswith("/acc") else "min"  # higher accuracy, lower loss is better
    if stopping.mode != wanted:
        direction = "rises" if wanted == "max" else "falls"
        yield (
            "regularization.early_stopping.mode",
            (
                f"is {stopping.mode}, but {stopping.monitor} improves as it {direction}; "
                f"set regularization.early_stopping.mode={wanted}"
            ),
        )


def _finder_ranges(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.lr_finder.max_lr <= cfg.lr_finder.min_lr:
        yield "lr_finder.max_lr", f"must be > lr_finder.min_lr={cfg.lr_finder.min_lr}, got {cfg.lr_finder.max_lr}"
    finder = cfg.batch_size_finder
    if finder.max_batch_size < finder.start:
        yield (
            "batch_size_finder.max_batch_size",
            f"must be >= batch_size_finder.start={finder.start}, got {finder.max_batch_size}",
        )


def _cuda_only(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    # device=auto picks CUDA when a GPU is visible here (see runtime.pick_device).
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.distributed.sync_batchnorm and not cuda:
        yield (
            "distributed.sync_batchnorm",
            (
                "SyncBatchNorm runs on CUDA GPUs only; on CPU leave it false "
                "(BatchNorm statistics are then averaged across ranks before eval and save)"
            ),
        )
    if cfg.distributed.backend == "nccl" and not cuda:
        yield (
            "distributed.backend",
            f"nccl runs on CUDA GPUs only, and device={cfg.device} is not one; use auto or gloo",
        )


def _augmentation_off(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    active = active_ops(cfg.augmentation)
    if cfg.augmentation.name == "none" and active:
        yield "augmentation.name", f"is 'none' but {', '.join(active)} is on; pick a name that augments or turn it off"


RELATIONS = (
    Relation(("required",), _required),
    Relation(("data.channels", "data.mean", "data.std"), _statistics_per_channel),
    Relation(
        ("data.name", "data.root", "data.channels", "data.num_classes", "data.val_fraction", "data.test_fraction"),
        _dataset_needs,
    ),
    Relation(("model.pretrained_path", "model.pretrained"), _pretrained_once),
    Relation(("optimizer.nesterov", "optimizer.momentum"), _nesterov_needs_momentum),
    Relation(("regularization.early_stopping",), _early_stopping_direction),
    Relation(("lr_finder", "batch_size_finder"), _finder_ranges),
    Relation(("device", "distributed.sync_batchnorm", "distributed.backend"), _cuda_only),
    unknown_keys("augmentation", AUGMENTATION_KEYS),
    unknown_keys("augmentation.color_jitter", COLOR_JITTER_KEYS),
    unknown_keys("augmentation.affine", AFFINE_KEYS),
    Relation(("augmentation",), _augmentation_off),
)


# ---- the pass ------------------------------------------------------------------------------


def problems(cfg: DictConfig) -> dict[str, str]:
    """{key: what is wrong and how to fix it} for every problem the config alone reveals."""
    return find_problems(cfg, RULES, RELATIONS)


def ignored_keys(cfg: DictConfig) -> list[str]:
    """Settings the chosen options do not use, each as one line: a value set there by mistake
    would otherwise be ignored in silence. Call it on a config without problems."""
    data, ignored = cfg.data, []
    if data.name in IN_MEMORY and data.num_workers > 0:
        ignored.append(
            f"data.num_workers={data.num_workers} is ignored: {data.name} is held in memory on the device "
            f"and sliced into batches without worker processes; leave it at 0"
        )
    if data.name in NEEDS_NO_FILES and data.get("root") is not None:
        ignored.append(f"data.root={data.root} is ignored: {data.name} reads no files; leave it null")
    if data.name not in DOWNLOADABLE and data.get("download"):
        ignored.append(f"data.download=true is ignored: {data.name} has nothing to download; leave it false")
    scheduler = cfg.scheduler
    if scheduler.get("warmup_start_factor") is not None and not scheduler.get("warmup_epochs"):
        ignored.append(
            "scheduler.warmup_start_factor is ignored with scheduler.warmup_epochs=0; set a warmup or leave it null"
        )
    if cfg.lr_finder.apply and not cfg.lr_finder.enabled:
        ignored.append("lr_finder.apply=true is ignored while lr_finder.enabled=false; enable the test to apply it")
    ops = active_ops(cfg.augmentation)
    if cfg.augmentation.get("random_order") and not ("color_jitter" in ops and "affine" in ops):
        ignored.append(
            "augmentation.random_order=true is ignored: it orders color_jitter and affine, and they are not both on"
        )
    return ignored


def validate(cfg: DictConfig) -> None:
    """Raise one ConfigError naming every problem of `cfg`; log the settings it ignores."""
    found = problems(cfg)
    if found:
        (key, message), *others = found.items()
        raise ConfigError(key, message + "".join(f"; also {other}: {text}" for other, text in others))
    if process_info().is_main:  # under torchrun every rank validates; one copy of each warning is enough
        for line in ignored_keys(cfg):
            log.warning(line)
