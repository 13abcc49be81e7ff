"""Fine-tuning: the classifier head, local pretrained weights, and freezing.

build_model (trainkit.models) applies `model.pretrained_path` and `model.freeze` through
`load_pretrained` and `freeze`; `head_parameters` feeds the optimizer's separate head LR
(`optimizer.head_lr_scale`); call `apply_frozen_bn_eval(model)` after every `model.train()` so
BatchNorm inside frozen layers keeps its statistics.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainkit.checkpoint import unwrap_model
from trainkit.errors import ConfigError
from trainkit.submodules import find_modules

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


def _head_parameter_names(model: nn.Module) -> set[str]:
    head = {id(p) for p in head_parameters(model)}
    return {name for name, param in model.named_parameters() if id(param) in head}


def _first_conv_weight_name(model: nn.Module) -> str | None:
    """State-dict key of the stem convolution: timm names it in pretrained_cfg, else the first Conv2d."""
    first_conv = (getattr(model, "pretrained_cfg", None) or {}).get("first_conv")
    if isinstance(first_conv, str):
        return f"{first_conv}.weight"
    convs = find_modules(model, nn.Conv2d)
    return f"{convs[0][0]}.weight" if convs else None


def adapt_input_channels(weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """A conv weight [out, c, k, k] made to take `in_channels` inputs (timm's rule): one channel
    gets the sum over the file's channels (grey = a mix of R, G, B, so the response to a grey
    image stays the same); more channels repeat the file's channels cyclically, scaled by
    c / in_channels so the activations keep their size."""
    file_channels = weight.shape[1]
    if in_channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeated = weight.repeat(1, math.ceil(in_channels / file_channels), 1, 1)[:, :in_channels]
    return repeated * (file_channels / in_channels)


def _strip_prefixes(key: str) -> str:
    """`module.` (DDP) and `_orig_mod.` (torch.compile), in any nesting, come off the front."""
    while key.startswith(("module.", "_orig_mod.")):
        key = key.split(".", 1)[1]
    return key


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors by name from a .safetensors file, a torch.save'd state dict, or a checkpoint
    holding one under "model" or "state_dict" (trainkit, Lightning, most repositories).
    Pickled files load with weights_only=True: no code from the file runs."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            "model.pretrained_path",
            f"no file at '{path}'; download the weights on a machine with network (e.g. "
            "torch.save(timm.create_model(name, pretrained=True).state_dict(), path)) and point "
            "model.pretrained_path at it",
        )
    state: Any  # what the file holds: checked below
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling, a truncated file, a safetensors header error
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ConfigError(
            "model.pretrained_path",
            f"could not read '{path}' ({type(error).__name__}: {reason}); save weights with "
            "torch.save(model.state_dict(), path) or safetensors.torch.save_file",
        ) from error
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            "model.pretrained_path", f"'{path}' does not hold a state dict (a mapping of names to tensors)"
        )
    return {_strip_prefixes(key): value for key, value in state.items()}


def load_pretrained(model: nn.Module, path: str | Path) -> None:
    """Load a local state dict into `model`, for a model that differs from the file's only where
    fine-tuning makes it differ:

    - `module.` / `_orig_mod.` prefixes are stripped;
    - classifier-head tensors of another shape (another number of classes) are dropped, and the
      head keeps its fresh initialization;
    - a stem convolution with another number of input channels is adapted (adapt_input_channels);
    - any other shape mismatch is an error (the file is for another architecture), and so is a
      file that matches no name at all. Missing and unexpected keys are reported in one line.
    """
    state = read_state_dict(path)
    own = model.state_dict()
    head_names = _head_parameter_names(model)
    first_conv = _first_conv_weight_name(model)
    dropped, mismatched = [], []
    for key, value in list(state.items()):
        if key not in own or own[key].shape == value.shape:
            continue
        target = own[key].shape
        if key == first_conv and value.ndim == 4 and (value.shape[0], value.shape[2:]) == (target[0], target[2:]):
            state[key] = adapt_input_channels(value, target[1]).to(value.dtype)
            log.info(f"pretrained: adapted {key} from {value.shape[1]} to {target[1]} input channels")
        elif key in head_names:
            dropped.append(f"{key} {tuple(value.shape)} -> {tuple(target)}")
            del state[key]
        else:
            mismatched.append(f"{key}: file {tuple(value.shape)} vs model {tuple(target)}")
    if mismatched:
        raise ConfigError(
            "model.pretrained_path",
            f"{len(mismatched)} tensors in '{path}' have other shapes than the model's "
            f"(e.g. {mismatched[0]}); the file holds weights for another architecture",
        )
    if not set(state) & set(own):
        raise ConfigError(
            "model.pretrained_path",
            f"no tensor name in '{path}' matches the model "
            f"(file: {next(iter(state), 'empty')}, model: {next(iter(own))}); "
            "the file holds weights for another model",
        )
    if dropped:
        log.info(
            "pretrained: dropped the classifier head (another number of classes), "
            f"it starts fresh: {', '.join(dropped)}"
        )
    result = model.load_state_dict(state, strict=False)

    def listed(keys: list[str]) -> str:
        return f"{len(keys)}" + (f" ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})" if keys else "")

    log.info(
        f"pretrained: loaded {len(set(state) & set(own))} tensors from {path}; "
        f"missing {listed(result.missing_keys)}, unexpected {listed(result.unexpected_keys)}"
    )


def stages(model: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """What `model.freeze: N` counts: the model's stages, in order, each as (the names of the
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
                "model.freeze",
                f"found no classifier head in {type(model).__name__} to keep training; "
                "use model.freeze=N (stages) or null",
            )
        frozen = [p for p in model.parameters() if id(p) not in head]
    elif isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        found = stages(model)
        if spec > len(found):
            raise ConfigError(
                "model.freeze",
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
