"""Fine-tuning, conf/config.yaml's `finetune` section: what is done to the network the `model` group built.

train.py and eval.py call `fine_tune` from marked lines (docs/features.md): it loads `finetune.pretrained_path`
(trainkit.models.pretrained), freezes what `finetune.freeze` says (`freeze`, `stages`; `freeze_bn`: the frozen
BatchNorm keeps its statistics) and returns the side every batch is resized to (`finetune.input_size`, or the data's,
raised to what the model needs: trainkit.models.input_size). The section's checks are here too (its `_checks_`).
Without this module a run trains the model as built, on batches of the data's own size.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator, Mapping

from omegaconf import DictConfig
from torch import nn

from trainkit.checkpointing.checkpoint import unwrap_model
from trainkit.config.declared import answer
from trainkit.config.schema import Check, Relation, flag, integer, show, string
from trainkit.config.validation import configured_data_class, configured_task, imported_target
from trainkit.data.datasets import ImageData
from trainkit.errors import ConfigError
from trainkit.models.input_size import resolve_input_size
from trainkit.models.pretrained import load_pretrained
from trainkit.models.submodules import head_parameters

log = logging.getLogger(__name__)


def fine_tune(model: nn.Module, model_config: Mapping, finetune: Mapping, image_size: int | None) -> int | None:
    """Load `finetune.pretrained_path`'s weights into `model` and freeze what `finetune.freeze` says; return the side
    length to resize batches to (None for data that is not images: `image_size` None)."""
    if finetune.get("pretrained_path"):
        load_pretrained(model, finetune["pretrained_path"])
    # After loading: the head check sees the final model.
    freeze(model, finetune.get("freeze"), freeze_bn=finetune.get("freeze_bn", True))
    if image_size is None:
        return None
    return resolve_input_size(model_config, image_size, finetune.get("input_size"), model)


def stages(model: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """What `finetune.freeze: N` counts: the model's stages, in order, each as (the names of the modules it spans, its
    parameters), up to (not including) the first that holds a classifier-head parameter. Parameters held by the model
    itself (a ViT's cls_token, pos_embed) and a stem go with the first stage. Per model kind:

    - timm models: the stages of `model.feature_info` (what features_only=True returns), each with what is registered
      between it and the previous one. resnet18: `conv1, bn1` (the stem), layer1, ..., layer4; convnext: `stem,
      stages.0`, stages.1, ...; ViT: `patch_embed, blocks.0`, blocks.1, ... (one block a stage). Layers after the last
      stage (a final norm) are in no stage: freeze them with `backbone`.
    - torchvision ResNets (and ResNeXt, Wide ResNet): the stem `conv1, bn1`, layer1, ..., layer4.
    - anything else: the top-level children that hold parameters (SmallCNN: features; a torchvision
      VGG/MobileNet/EfficientNet: features, one stage: N=1 is `backbone`, minus any non-head layers inside the head's
      own child).
    """
    model = unwrap_model(model)
    head = {id(p) for p in head_parameters(model)}
    modules = list(model.named_modules())  # pre-order: a module's subtree follows it
    ends = []
    for boundary in _stage_boundaries(model):
        inside = [i for i, (name, _) in enumerate(modules) if name == boundary or name.startswith(boundary + ".")]
        ends.append(max(inside) if inside else -1)
    groups: list[list[nn.Parameter]] = []
    if not ends or min(ends) < 0 or ends != sorted(ends):  # no stage list, or one that does not match the model
        groups = [list(child.parameters()) for _, child in model.named_children()]
    else:
        start = 0
        for end in ends:  # each module's own parameters, from the previous stage's end to this one's
            groups.append([p for _, module in modules[start : end + 1] for p in module.parameters(recurse=False)])
            start = end + 1
    found = []
    for params in groups:
        if not params:
            continue
        if any(id(p) in head for p in params):
            break
        found.append((", ".join(_covering_module_names(model, {id(p) for p in params})), params))
    return found


def _stage_boundaries(model: nn.Module) -> list[str]:
    """The dotted names of the modules that end each stage (see `stages`); empty: no such list."""
    feature_info = getattr(model, "feature_info", None)
    if isinstance(feature_info, list) and all(isinstance(info, dict) and "module" in info for info in feature_info):
        return [str(info["module"]) for info in feature_info]  # timm
    children = dict(model.named_children())
    resnet_layers = [f"layer{i}" for i in range(1, 5)]
    if type(model).__module__.startswith("torchvision.models") and {"maxpool", *resnet_layers} <= set(children):
        return ["maxpool", *resnet_layers]  # the stem ends with the max-pool
    return []


def freeze(model: nn.Module, spec: str | int | None, freeze_bn: bool = True) -> list[str]:
    """Stop training part of the model; return the names of the frozen modules (maximal subtrees).

    `spec`: null (nothing) | "backbone" (everything but the classifier head, see head_parameters)
    | N (the first N stages, see `stages`). Frozen parameters get requires_grad=False: no gradient, left out of the
    optimizer's parameter groups (so no weight decay either), and unchanged by training, bit for bit.

    `freeze_bn`: BatchNorm layers inside the frozen part keep their running statistics. The model remembers their names,
    and its `train()` puts them back in eval mode after every call (mode is not a parameter, so requires_grad cannot do
    it).
    """
    model = unwrap_model(model)
    if spec is None or (isinstance(spec, int) and not isinstance(spec, bool) and spec == 0):
        return []
    head = {id(p) for p in head_parameters(model)}
    if spec == "backbone":
        if not head:
            raise ConfigError(
                "finetune.freeze",
                f"found no classifier head in {type(model).__name__} to keep training; "
                "use finetune.freeze=N (stages) or null",
            )
        frozen = [p for p in model.parameters() if id(p) not in head]
    elif isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        found = stages(model)
        if spec > len(found):
            raise ConfigError(
                "finetune.freeze",
                f"{type(model).__name__} has {len(found)} stages before its head "
                f"({', '.join(n for n, _ in found) or 'none'}); use at most {len(found)}, "
                "'backbone' or null",
            )
        frozen = list(model.parameters(recurse=False))
        for _, params in found[:spec]:
            frozen += params
    else:
        raise ValueError(f"freeze: spec must be null, 'backbone' or a number of stages >= 0, got {spec!r}")
    for param in frozen:
        param.requires_grad_(False)
    names = _covering_module_names(model, {id(p) for p in model.parameters() if not p.requires_grad})
    if freeze_bn:
        inside = lambda name: any(r == "" or name == r or name.startswith(r + ".") for r in names)  # noqa: E731
        # nn.Module's __setattr__ stub takes Tensor | Module only; any value works (_train_keeping_frozen_bn reads it).
        model.frozen_batchnorm_names = [  # type: ignore[assignment]
            name
            for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and inside(name)
        ]
        # On the model itself rather than its BatchNorm layers: SyncBatchNorm conversion replaces those but keeps
        # the model and the names; DDP, torch.compile and FSDP call it through their own train(), and the deep
        # copy EMA makes binds it to the copy.
        model.train = types.MethodType(_train_keeping_frozen_bn, model)  # type: ignore[method-assign]
    total = sum(p.numel() for p in model.parameters())
    count = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    log.info(
        f"froze {count:,} of {total:,} parameters ({spec}): {', '.join(n or '(whole model)' for n in names)}"
        f"{'; their BatchNorm statistics too' if freeze_bn else ''}"
    )
    return names


def _covering_module_names(module: nn.Module, chosen: set[int], prefix: str = "") -> list[str]:
    """The largest submodules all of whose parameters are among `chosen` (ids; modules without
    parameters skipped), in registration order; "" for `module` itself."""
    params = list(module.parameters())
    if not params:
        return []
    if all(id(p) in chosen for p in params):
        return [prefix]
    names = []
    for name, child in module.named_children():
        names += _covering_module_names(child, chosen, f"{prefix}.{name}" if prefix else name)
    return names


def _train_keeping_frozen_bn(model: nn.Module, mode: bool = True) -> nn.Module:
    """The model's own `train(mode)`, then its frozen BatchNorm layers back in eval mode: every `model.train()`
    (the loop's, the finders', the memory search's) keeps their running statistics."""
    type(model).train(model, mode)
    for name in getattr(model, "frozen_batchnorm_names", ()):
        model.get_submodule(name).eval()
    return model


# ---- its config checks (gathered by the config check: conf/config.yaml's finetune._checks_) ----


def freeze_spec(value: object) -> str | None:
    if value is None or value == "backbone" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return f"must be null, backbone or a number of stages >= 0, got {show(value)}"


CONFIG_RULES: dict[str, Check] = {
    "finetune.pretrained_path": string(null=True),
    "finetune.freeze": freeze_spec,
    "finetune.freeze_bn": flag(),
    "finetune.input_size": integer(1, null=True),
}


def _pretrained_once(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A file of weights for a model that loads its own: it declares `own_weights`, a function of its
    arguments giving the key that asked for them (timm's: model.pretrained), or None."""
    stale, key = answer(imported_target(cfg.model), "own_weights", cfg.model)
    if stale:
        yield "model._target_", stale
    elif cfg.finetune.pretrained_path and key:
        yield (
            "finetune.pretrained_path",
            f"is set together with {key}=true; load weights one way: set {key}=false to use the file",
        )


def _resize_only_images_without_spatial_targets(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """A resize works on images, and moves them without a target per pixel (a mask) that the task reads."""
    if cfg.finetune.input_size is None:
        return
    data, task = configured_data_class(cfg), configured_task(cfg)
    if data is not None and not issubclass(data, ImageData):
        what = f"{cfg.data.name} is {data.kind} data ({data.__name__}), not images"
        yield "finetune.input_size", f"resizes images, but {what}; leave it null"
    elif task is not None and getattr(task, "spatial_targets", False):
        yield (
            "finetune.input_size",
            f"resizes the images but not their targets ({task.__name__} has a target per pixel); leave it null",
        )


CONFIG_RELATIONS = (
    Relation(("finetune.pretrained_path", "model._target_"), _pretrained_once),
    Relation(("data._target_", "task._target_", "finetune.input_size"), _resize_only_images_without_spatial_targets),
)
