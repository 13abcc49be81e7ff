"""Fine-tuning: which parameters are the classifier head, and freezing the rest stage by stage.

build_model (trainkit.models.build) applies `finetune.freeze` through `freeze` (and `finetune.pretrained_path`
through trainkit.models.pretrained); `head_parameters` feeds the optimizer's separate head LR
(`optimizer.head_lr_scale`); call `apply_frozen_bn_eval(model)` after every `model.train()` so
BatchNorm inside frozen layers keeps its statistics.
"""

from __future__ import annotations

import logging

from torch import nn

from trainkit.checkpointing.checkpoint import unwrap_model
from trainkit.errors import ConfigError
from trainkit.models.submodules import find_modules

log = logging.getLogger(__name__)


def head_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The parameters of the classifier head (empty if none is found).

    timm models: `model.get_classifier()`; models with a `.head` module (SmallCNN, your own):
    its parameters; anything else (torchvision): the last nn.Linear in registration order.
    """
    model = unwrap_model(model)
    if hasattr(model, "get_classifier"):
        # nn.Module's stubs type any other attribute as Tensor | Module (its __getattr__); this is timm's method.
        head = model.get_classifier()  # type: ignore[operator]
    elif isinstance(getattr(model, "head", None), nn.Module):
        head = model.head
    else:
        linears = find_modules(model, nn.Linear)
        head = linears[-1][1] if linears else None
    return set(head.parameters()) if isinstance(head, nn.Module) else set()


def stages(model: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """What `finetune.freeze: N` counts: the model's stages, in order, each as (the names of the
    modules it spans, its parameters), up to (not including) the first that holds a
    classifier-head parameter. Parameters held by the model itself (a ViT's cls_token, pos_embed)
    and a stem go with the first stage. Per model kind:

    - timm models: the stages of `model.feature_info` (what features_only=True returns), each
      with what is registered between it and the previous one. resnet18: `conv1, bn1` (the
      stem), layer1, ..., layer4; convnext: `stem, stages.0`, stages.1, ...; ViT: `patch_embed,
      blocks.0`, blocks.1, ... (one block a stage). Layers after the last stage (a final norm)
      are in no stage: freeze them with `backbone`.
    - torchvision ResNets (and ResNeXt, Wide ResNet): the stem `conv1, bn1`, layer1, ..., layer4.
    - anything else: the top-level children that hold parameters (SmallCNN: features; a
      torchvision VGG/MobileNet/EfficientNet: features, one stage: N=1 is `backbone`, minus any
      non-head layers inside the head's own child).
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
    | N (the first N stages, see `stages`). Frozen parameters get requires_grad=False: no
    gradient, left out of the optimizer's parameter groups (so no weight decay either), and
    unchanged by training, bit for bit.

    `freeze_bn`: BatchNorm layers inside the frozen part keep their running statistics. The
    model remembers their names; call `apply_frozen_bn_eval(model)` after each `model.train()`
    to put them back in eval mode (mode is not a parameter, so requires_grad cannot do it).
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
    names = _frozen_module_names(model)
    if freeze_bn:
        inside = lambda name: any(r == "" or name == r or name.startswith(r + ".") for r in names)  # noqa: E731
        # nn.Module's __setattr__ stub takes Tensor | Module only; any value works (apply_frozen_bn_eval reads it).
        model.frozen_batchnorm_names = [  # type: ignore[assignment]
            name
            for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and inside(name)
        ]
    total = sum(p.numel() for p in model.parameters())
    count = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    log.info(
        f"froze {count:,} of {total:,} parameters ({spec}): {', '.join(n or '(whole model)' for n in names)}"
        f"{'; their BatchNorm statistics too' if freeze_bn else ''}"
    )
    return names


def _frozen_module_names(model: nn.Module) -> list[str]:
    """The largest submodules whose parameters are all frozen (modules without parameters skipped)."""
    return _covering_module_names(model, {id(p) for p in model.parameters() if not p.requires_grad})


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


def apply_frozen_bn_eval(model: nn.Module) -> None:
    """Put the BatchNorm layers that `freeze` froze back in eval mode: call after `model.train()`.

    An explicit call in the loop rather than an overridden `train()`: it shows in train.py next to
    `model.train()`, and it survives what rebuilds or wraps modules (SyncBatchNorm conversion keeps
    the names, DDP and torch.compile are unwrapped here, a deep copy for EMA keeps the list).
    """
    model = unwrap_model(model)
    for name in getattr(model, "frozen_batchnorm_names", ()):
        model.get_submodule(name).eval()
