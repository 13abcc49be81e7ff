"""Check the composed config in one pass before any data or model is built: RULES (trainkit.config.rules) per key,
RELATIONS here between keys, the checks the chosen options declare beside their code, and the `???` keys still missing:

    error: data.batch_size: must be a whole number >= 1, got 0; also optimizer.lr: must be ...

What only files or the built model reveal is checked where it arises, in the same one-line form."""

import dataclasses
import logging
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from trainkit.config.declared import answer, arguments, declared, feature_checks, feature_modules, parameters
from trainkit.config.rules import AUGMENTATION_KEYS, RULES
from trainkit.config.schema import Relation, find_problems, show, unknown_keys
from trainkit.data.datasets import Data, ImageData, data_class
from trainkit.distributed.process_group import process_info
from trainkit.errors import ConfigError
from trainkit.tasks.task import higher_is_better, metric_names_of

log = logging.getLogger(__name__)


# ---- relations: keys that contradict each other --------------------------------------------


def _required(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """The keys an experiment lists in `required` must be given (not null or false); `???` cannot say it, as merging
    `???` over a group's value keeps the value."""
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


def configured_data_class(cfg: DictConfig) -> type[Data] | None:
    """The class `data._target_` names, imported but not built (None when it cannot be imported)."""
    try:
        return data_class(str(cfg.data.get("_target_")))
    except ConfigError:
        return None


def _data_keys(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """data._target_ names a Data class, whose fields are the option's keys (else a TypeError stops the run later)."""
    target = cfg.data.get("_target_")
    if target is None:
        yield "data._target_", "is required: the dataclass of the data option, e.g. trainkit.data.datasets.Digits"
        return
    try:
        data = data_class(target)
    except ConfigError as error:
        yield error.key, error.message
        return
    fields = {field.name: field for field in dataclasses.fields(data) if field.init}  # not what splits() sets
    for key in cfg.data:
        if key != "_target_" and key not in fields:
            yield (
                f"data.{key}",
                f"is not a key of {data.__name__} ({cfg.data._target_}), which takes {', '.join(fields)}; "
                f"remove it, or add a field to the class",
            )
    for name, field in fields.items():
        no_default = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if no_default and name not in cfg.data:
            yield f"data.{name}", f"is required by {data.__name__}; add it to the data option or pass +data.{name}=..."


def _dataset_needs(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """What the chosen dataset needs from the other data keys, as its class says."""
    data, kind = cfg.data, configured_data_class(cfg)
    if kind is None:
        return
    if kind.needs_root and data.get("root") is None:
        yield "data.root", f"is required for {data.name}; pass data.root=... ({kind.needs_root})"
    if getattr(kind, "decodes_images", False) and data.channels not in (1, 3):
        yield (
            "data.channels",
            f"is {data.channels}, but images decode as greyscale (1) or RGB (3); set data.channels=1 or 3",
        )
    if kind.needs_num_classes and data.get("num_classes") is None:
        yield "data.num_classes", f"is null, but {data.name} generates its classes; set data.num_classes=N"
    fractions = [key for key in ("val_fraction", "test_fraction") if data.get(key) is not None]
    total = sum(data[key] for key in fractions)
    if total >= 1:
        keys = " + ".join(f"data.{key}" for key in fractions)
        yield f"data.{fractions[0]}", f"{keys} = {total:g} leaves no training samples; lower them"


def _nesterov_needs_momentum(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.optimizer.get("nesterov") and not cfg.optimizer.get("momentum"):
        yield "optimizer.nesterov", "needs optimizer.momentum > 0; set a momentum or optimizer.nesterov=false"


def configured_task(cfg: DictConfig) -> type | None:
    """The class `task._target_` names, imported but not built; None when it cannot be (_task_metrics says why)."""
    task = imported_target(cfg.task)
    return task if isinstance(task, type) else None


def _task_metrics(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """The task class (imported, not built) names its metrics: what may be monitored and optimized."""
    task = configured_task(cfg)
    if task is None:
        yield (
            "task._target_",
            f"cannot import {cfg.task._target_!r}; point it at module.Class, e.g. "
            "trainkit.tasks.classification.Classification",
        )
        return
    for key, splits in (("regularization.early_stopping.monitor", ("val",)), ("optimized_metric", ("val", "test"))):
        allowed = [f"{split}/{name}" for split in splits for name in metric_names_of(task)]
        if (value := OmegaConf.select(cfg, key)) not in allowed:
            yield key, f"must be one of {', '.join(allowed)} (the metrics of {task.__name__}), got {show(value)}"


def augmentation_ops(cfg: DictConfig) -> dict[str, Any]:
    """{op: its options} for each op cfg.augmentation switches on: the core's, and its `_checks_` modules' own."""
    ops = {key: cfg.augmentation[key] for key in ("crop_padding", "horizontal_flip") if cfg.augmentation.get(key)}
    for _, feature in feature_modules(cfg):
        ops |= getattr(feature, "augmentation_ops", lambda augmentation: {})(cfg.augmentation)
    return ops


def _augmentation_keys(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A closed section (the core's keys, and those its `_checks_` modules have rules for), then not `none` while on."""
    features = {key.split(".")[1] for key in feature_checks(cfg)[0] if key.startswith("augmentation.")}
    unknown = list(unknown_keys("augmentation", (*AUGMENTATION_KEYS, *sorted(features))).check(cfg))
    yield from unknown
    active = {} if unknown else augmentation_ops(cfg)
    if cfg.augmentation.name == "none" and active:
        yield "augmentation.name", f"is 'none' but {', '.join(active)} is on; pick a name that augments or turn it off"


def _spatial_targets(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A task with a target per pixel moves it with the image itself: refuse the ops that would move or mix the image
    alone, all but those a feature module says change each pixel where it is (its PIXEL_WISE_OPS)."""
    task = configured_task(cfg)
    if task is None or not getattr(task, "spatial_targets", False):
        return
    pixel_wise = {op for _, feature in feature_modules(cfg) for op in getattr(feature, "PIXEL_WISE_OPS", ())}
    for key in augmentation_ops(cfg):
        if key not in pixel_wise:
            yield (
                f"augmentation.{key}",
                f"moves or mixes the image without its targets ({task.__name__} has a target per pixel); "
                f"use an augmentation without it (augmentation=none) and the task's own flips and shifts "
                f"(task.horizontal_flip, task.crop_padding)",
            )
    if cfg.data.get("mirror_changes_label") and cfg.task.get("horizontal_flip"):
        yield "task.horizontal_flip", "mirrors the images, but data.mirror_changes_label=true; set it false"


def _a_name_a_class(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """task.class_names holds as many names as classes (unless data.num_classes is null: counted later)."""
    names, count = cfg.task.get("class_names"), cfg.data.get("num_classes")
    if OmegaConf.is_list(names) and isinstance(count, int) and len(names) != count:
        yield (
            "task.class_names",
            f"has {len(names)} names but data.num_classes is {count}; give one name per class (index k names "
            f"class k) or task.class_names=null",
        )


def imported_target(section: Mapping) -> object | None:
    """What a section's `_target_` names (the model's, the scheduler's), imported but not called; None if that fails."""
    from hydra.utils import get_object

    try:
        return get_object(str(section.get("_target_", "")))
    except Exception:  # hydra raises several kinds for a path it cannot import
        return None


SCHEDULE_GIVEN = ("update", "updates_per_epoch", "total_updates")  # what trainkit.optim.lr_schedule passes


def _schedule_arguments(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """The scheduler's keys besides _target_ must be arguments of the function it names (trainkit.schedules)."""
    target, schedule = cfg.scheduler.get("_target_"), imported_target(cfg.scheduler)
    if not callable(schedule):
        yield (
            "scheduler._target_",
            f"{show(target)} is not a function that can be imported; name a schedule such as "
            "trainkit.schedules.cosine (conf/scheduler/ lists them)",
        )
        return
    takes = parameters(schedule)
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in takes.values()):
        return
    missing = [name for name in SCHEDULE_GIVEN if name not in takes]
    if missing:
        yield (
            "scheduler._target_",
            f"{target} does not take {', '.join(missing)}; a schedule takes {', '.join(SCHEDULE_GIVEN)}",
        )
    own = [name for name in takes if name not in SCHEDULE_GIVEN]
    for key in cfg.scheduler:
        if key != "_target_" and str(key) not in own:
            yield (
                f"scheduler.{key}",
                f"is not an argument of {target}, which takes {', '.join(own) or 'none of its own'}; remove it "
                f"(~scheduler.{key}) or pick a schedule that takes it",
            )


def _per_pixel_model_needs_per_pixel_task(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A model declaring `spatial_outputs` gives logits [B, K, H, W], which a task with one target per image cannot
    score."""
    task, model = configured_task(cfg), imported_target(cfg.model)
    if task is None or not getattr(model, "spatial_outputs", False) or getattr(task, "spatial_targets", False):
        return
    suits = " or ".join(getattr(model, "suits", ()))
    yield (
        "model._target_",
        f"{cfg.model._target_} gives one class per pixel ([B, K, H, W] logits), but {task.__name__} needs "
        f"one row of logits per image; use a task with one target per pixel{f' ({suits})' if suits else ''} or a "
        f"classification model (model=cnn, timm or torchvision)",
    )


def _input_size_fits_the_model(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """data.image_size must be divisible by the model's `input_size_multiple`, where it declares one."""
    side = cfg.data.get("image_size")
    if not isinstance(side, int):
        return
    model, question = imported_target(cfg.model), "input_size_multiple"
    stale, multiple = answer(model, question, cfg.model)
    if stale:
        yield "model._target_", stale
    if stale or not isinstance(multiple, int) or multiple < 1 or side % multiple == 0:
        return
    below, above = side - side % multiple, side - side % multiple + multiple
    choices = f"{below} or {above}" if below else str(above)
    given = arguments(model, getattr(model, question), cfg.model) or {}  # what the question was asked with
    settings = ", ".join(f"model.{name}={value}" for name, value in given.items())
    yield (
        "data.image_size",
        f"is {side}, but {cfg.model._target_} ({settings}) takes sizes divisible "
        f"by {multiple}; use data.image_size={choices}, or a model that halves the size fewer times",
    )


def _early_stopping_direction(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    stopping, task = cfg.regularization.early_stopping, configured_task(cfg)
    if task is None or stopping.monitor.rsplit("/", 1)[-1] not in metric_names_of(task):
        return  # _task_metrics said what is wrong
    wanted = "max" if higher_is_better(task, stopping.monitor) else "min"  # higher accuracy, lower loss is better
    if stopping.mode != wanted:
        direction = "rises" if wanted == "max" else "falls"
        yield (
            "regularization.early_stopping.mode",
            f"is {stopping.mode}, but {stopping.monitor} improves as it {direction}; "
            f"set regularization.early_stopping.mode={wanted}",
        )


def _cuda_only(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())  # as pick_device
    if cfg.distributed.sync_batchnorm and not cuda:
        yield (
            "distributed.sync_batchnorm",
            "SyncBatchNorm runs on CUDA GPUs only; on CPU leave it false "
            "(BatchNorm statistics are then averaged across ranks before eval and save)",
        )
    if cfg.distributed.backend == "nccl" and not cuda:
        yield (
            "distributed.backend",
            f"nccl runs on CUDA GPUs only, and device={cfg.device} is not one; use auto or gloo",
        )


def _strategy(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """distributed.parallel names a strategy class; without one, the run is ddp (replicas) or a single process."""
    from trainkit.distributed.parallel import strategy

    named = cfg.distributed.get("parallel")
    if not named and cfg.distributed.name not in ("none", "ddp"):
        yield (
            "distributed.name",
            f"is {cfg.distributed.name}, which is none or ddp unless distributed.parallel names its strategy; "
            "pick one with distributed=<option of conf/distributed>",
        )
        return
    try:
        strategy(named)
    except ConfigError as error:
        yield error.key, error.message


def flip_refused(cfg: DictConfig, flip: str = "horizontal_flip") -> Iterator[tuple[str, str]]:
    """Refuse augmentation.<flip>, where it is on, when the data says a mirror image changes its label."""
    if OmegaConf.select(cfg.augmentation, flip, default=None) and cfg.data.get("mirror_changes_label"):
        yield (
            f"augmentation.{flip}",
            f"is on, but {cfg.data.name} sets data.mirror_changes_label=true (a mirrored 2 is not a 2); "
            f"use augmentation=shift or augmentation.{flip}=false, "
            f"or set data.mirror_changes_label=false if your images are mirror-safe",
        )


def _image_ops_need_images(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """Refuse the augmentation group and the memory layout on data other than images (rather than ignore them)."""
    data = configured_data_class(cfg)
    if data is None or issubclass(data, ImageData):
        return
    what = f"{cfg.data.name} is {data.kind} data ({data.__name__}), not images"
    active = augmentation_ops(cfg)
    if active:
        yield "augmentation", f"{', '.join(active)} transform images, but {what}; use augmentation=none"
    if cfg.trainer.channels_last:
        yield "trainer.channels_last", f"lays out image batches, but {what}; set trainer.channels_last=false"


def _a_micro_batch_below_the_batch(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """Larger than the batch would be no split at all: say so rather than train whole batches silently."""
    micro, batch_size = cfg.trainer.micro_batch_size, cfg.data.batch_size
    sized = getattr(configured_data_class(cfg), "size_unit", None) is not None  # counts units (tokens), not items
    # A data.batch_size a feature searches before training (searched_keys) is known later; a larger N is then one part.
    searched = any(
        "data.batch_size" in getattr(feature, "searched_keys", lambda cfg: ())(cfg)
        for _, feature in feature_modules(cfg)
    )
    if isinstance(micro, int) and micro > batch_size and not searched and not sized:
        yield (
            "trainer.micro_batch_size",
            f"is {micro}, larger than data.batch_size={batch_size}: nothing to split; set it to at most {batch_size}",
        )


def _a_coupled_batch_is_not_cut(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A task whose loss couples a batch's samples (couples_batch) trains on another loss in parts of it."""
    task, micro = configured_task(cfg), cfg.trainer.micro_batch_size
    if task is not None and getattr(task, "couples_batch", False) and micro is not None:
        yield (
            "trainer.micro_batch_size",
            f"is {micro}, but {task.__name__}'s loss couples the samples of a batch (couples_batch: each sample's "
            f"loss reads the others), so micro-batches would train on another loss; set trainer.micro_batch_size=null "
            f"(a smaller data.batch_size or precision=bf16 saves memory)",
        )


RELATIONS = (
    Relation(("required",), _required),
    Relation(("data._target_",), _data_keys),
    Relation(
        ("data._target_", "data.root", "data.channels", "data.num_classes", "data.val_fraction", "data.test_fraction"),
        _dataset_needs,
    ),
    Relation(("trainer.micro_batch_size", "data.batch_size"), _a_micro_batch_below_the_batch),
    Relation(("task._target_", "trainer.micro_batch_size"), _a_coupled_batch_is_not_cut),
    Relation(("optimizer.nesterov", "optimizer.momentum"), _nesterov_needs_momentum),
    Relation(("task._target_", "regularization.early_stopping.monitor", "optimized_metric"), _task_metrics),
    Relation(("task._target_", "regularization.early_stopping"), _early_stopping_direction),
    Relation(("device", "distributed.sync_batchnorm", "distributed.backend"), _cuda_only),
    Relation(("distributed.name", "distributed.parallel"), _strategy),
    Relation(("augmentation",), _augmentation_keys),
    # after the augmentation checks: a bad augmentation section is reported once, as itself
    Relation(("data.mirror_changes_label", "augmentation"), flip_refused),
    Relation(("task._target_", "augmentation", "data.mirror_changes_label"), _spatial_targets),
    Relation(("data._target_", "augmentation", "trainer.channels_last"), _image_ops_need_images),
    Relation(("task._target_", "model._target_"), _per_pixel_model_needs_per_pixel_task),
    Relation(("task.class_names", "data.num_classes"), _a_name_a_class),
    Relation(("model._target_", "data.image_size"), _input_size_fits_the_model),
    Relation(("scheduler",), _schedule_arguments),
)


# ---- the pass ------------------------------------------------------------------------------


def problems(cfg: DictConfig) -> dict[str, str]:
    """{key: what is wrong and how to fix it} for every problem the config alone reveals (after fill_task_defaults)."""
    fill_task_defaults(cfg)
    data, model, schedule = configured_data_class(cfg), imported_target(cfg.model), imported_target(cfg.scheduler)
    rules, relations = declared({"data": data, "model": model, "task": configured_task(cfg), "scheduler": schedule})
    feature_rules, feature_relations = feature_checks(cfg)  # each optional feature's, declared beside its code
    return find_problems(cfg, RULES | rules | feature_rules, (*RELATIONS, *relations, *feature_relations))


def unread_settings(cfg: DictConfig, chosen: Collection[str] | None = None) -> dict[str, str]:
    """{key: why nothing reads it}: label smoothing a task without classes does not take, where it was `chosen` (set
    or searched; None: this run's overrides; the default is a classification recipe's), and each feature's own."""
    from hydra.core.hydra_config import HydraConfig

    if chosen is None and HydraConfig.initialized():  # the keys the command line set and those the sweeper searches
        hydra_cfg: Any = HydraConfig.get()
        overrides = OmegaConf.select(hydra_cfg, "overrides.task", default=None) or []
        params = OmegaConf.select(hydra_cfg, "sweeper.params", default=None) or {}
        chosen = {str(item).split("=", 1)[0].lstrip("+~") for item in overrides} | {str(key) for key in params}
    unread = {}
    smoothing = OmegaConf.select(cfg, "regularization.label_smoothing", default=None)
    task_values = OmegaConf.to_container(cfg.task, resolve=False) if isinstance(cfg.get("task"), DictConfig) else {}
    reads_smoothing = "${regularization.label_smoothing}" in str(task_values)
    if smoothing and "regularization.label_smoothing" in (chosen or ()) and not reads_smoothing:
        unread["regularization.label_smoothing"] = f"{cfg.task.get('_target_')} takes no label smoothing"
    for _, feature in feature_modules(cfg):  # each optional feature's own (declared.feature_modules)
        unread |= getattr(feature, "unread_settings", lambda cfg: {})(cfg)
    return unread


def ignored_keys(cfg: DictConfig) -> list[str]:
    """Settings the chosen options do not use, one line each. Call it on a config without problems."""
    data, kind = cfg.data, configured_data_class(cfg)
    ignored = [
        f"{key}={OmegaConf.select(cfg, key)} is ignored: {why}; leave it 0" for key, why in unread_settings(cfg).items()
    ]
    workers = data.get("num_workers", 0)
    if kind is not None and kind.in_memory and workers != "auto" and workers > 0:  # auto: none needed
        ignored.append(
            f"data.num_workers={workers} is ignored: {data.name} is held in memory on the device "
            f"and sliced into batches without worker processes; leave it at 0"
        )
    if kind is not None and not kind.uses_root and data.get("root") is not None:
        ignored.append(f"data.root={data.root} is ignored: {data.name} reads no files; leave it null")
    if kind is not None and not kind.downloadable and data.get("download"):
        ignored.append(f"data.download=true is ignored: {data.name} has nothing to download; leave it false")
    if cfg.scheduler.get("warmup_start_factor") is not None and not cfg.scheduler.get("warmup_epochs"):
        ignored.append(
            "scheduler.warmup_start_factor is ignored with scheduler.warmup_epochs=0; set a warmup or leave it null"
        )
    for _, feature in feature_modules(cfg):  # each optional feature's own (declared.feature_modules)
        ignored += getattr(feature, "ignored_settings", lambda cfg: ())(cfg)
    return ignored


def fill_task_defaults(cfg: DictConfig) -> None:
    """Set the keys conf/ leaves null to the task's defaults (optimized_metric, early_stopping's monitor and mode) in
    the config itself, so saved configs name them."""
    task = configured_task(cfg)
    if task is None:
        return  # _task_metrics says why
    headline = getattr(task, "headline_metric", "loss")
    if OmegaConf.select(cfg, "optimized_metric", default=None) is None:
        cfg.optimized_metric = f"val/{headline}"
    stopping = OmegaConf.select(cfg, "regularization.early_stopping")
    if stopping is None:
        return
    if stopping.get("monitor") is None:
        stopping.monitor = f"val/{getattr(task, 'monitored_metric', None) or headline}"
    if stopping.get("mode") is None and isinstance(stopping.monitor, str):
        stopping.mode = "max" if higher_is_better(task, stopping.monitor) else "min"


def validate(cfg: DictConfig) -> None:
    """fill_task_defaults, then raise one ConfigError naming every problem of `cfg`; log the settings it ignores."""
    found = problems(cfg)
    if found:
        (key, message), *others = found.items()
        raise ConfigError(key, message + "".join(f"; also {other}: {problem}" for other, problem in others))
    if process_info().is_main:  # under torchrun every rank validates; one copy of each warning is enough
        for line in ignored_keys(cfg):
            log.warning(line)
