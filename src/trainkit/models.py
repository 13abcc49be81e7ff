"""Models: a small CNN, any timm model, any torchvision classifier, and the size they take.

train.py calls one function:

    model, input_size = build_model(cfg.model, image_size=cfg.data.image_size)

`cfg.model` (conf/model/*.yaml) names a factory in `_target_`; its other keys are the
factory's arguments, except four that build_model handles itself:

    input_size: null        # side length every batch is resized to (null: the data's size,
                            # raised to what the model needs, e.g. 224 for a ViT)
    pretrained_path: null   # a local state dict (.pt/.pth/.safetensors or a trainkit checkpoint)
                            # loaded after building: see load_pretrained
    freeze: null            # null | backbone | N (the first N stages): see freeze
    freeze_bn: true         # BatchNorm inside frozen parts keeps its running statistics

Fine-tuning helpers: `head_parameters` (the classifier head, for a separate head LR),
`freeze` and `apply_frozen_bn_eval` (call it after every `model.train()`).

timm and torchvision are imported inside the functions that use them (each takes seconds), so
the default small CNN, `--help` and config errors stay fast.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from trainkit.checkpoint import unwrap_model
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

# torchvision models that, built without weights, take exactly 224x224 inputs (their own
# metadata only gives a minimum, and vit_h_14's first weights even say 518).
TORCHVISION_FIXED_SIZE_PREFIXES = ("vit_", "maxvit_")


def build_model(model_config: Mapping, image_size: int) -> tuple[nn.Module, int]:
    """Instantiate the configured model; return it and the side length to resize batches to."""
    import hydra.utils
    from omegaconf import DictConfig, OmegaConf

    if isinstance(model_config, DictConfig):
        config = OmegaConf.to_container(model_config, resolve=True)
    else:
        config = dict(model_config)
    input_size = config.pop("input_size", None)
    pretrained_path = config.pop("pretrained_path", None)
    freeze_spec = config.pop("freeze", None)
    freeze_bn = config.pop("freeze_bn", True)
    if pretrained_path and config.get("pretrained"):
        raise ConfigError("model.pretrained_path", "is set together with model.pretrained=true; "
                          "load weights one way: set model.pretrained=false to use the file")
    # _convert_="all": the factories get plain lists and dicts, not ListConfig.
    model = hydra.utils.instantiate(config, _convert_="all")
    if pretrained_path:
        load_pretrained(model, pretrained_path)
    freeze(model, freeze_spec, freeze_bn=freeze_bn)  # after loading: the head check sees the final model
    return model, resolve_input_size(config, image_size, input_size, model)


def resolve_input_size(model_config: Mapping, image_size: int, input_size: int | None = None, model: nn.Module | None = None) -> int:
    """The explicit `input_size` if set, else `image_size` raised to the model's minimum (or
    its one fixed size). Checks an explicit size against what the model accepts."""
    minimum, fixed = input_size_limits(model_config, model)
    name = model_config.get("name", model_config.get("_target_", "this model"))
    if input_size is None:
        return fixed or max(image_size, minimum)
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1:
        raise ConfigError("model.input_size", f"must be a positive integer or null (auto), got {input_size!r}")
    if fixed and input_size != fixed:
        raise ConfigError("model.input_size", f"{name} takes only {fixed}x{fixed} inputs; set model.input_size=null or {fixed}")
    if input_size < minimum:
        raise ConfigError("model.input_size", f"{name} needs inputs of at least {minimum}x{minimum}; set model.input_size=null or >= {minimum}")
    return input_size


def input_size_limits(model_config: Mapping, model: nn.Module | None = None) -> tuple[int, int | None]:
    """(smallest side length the model accepts, its one fixed size or None), from the model's
    library metadata, without building the model (pass `model` when you have it: its own
    metadata wins). Models of other factories accept any size: (1, None)."""
    target = str(model_config.get("_target_", ""))
    name = model_config.get("name")
    if target.endswith("create_timm_model") or hasattr(model, "pretrained_cfg"):
        pretrained_cfg = getattr(model, "pretrained_cfg", None)
        if pretrained_cfg is None:
            from timm.models import get_pretrained_cfg

            found = get_pretrained_cfg(name)
            pretrained_cfg = found.to_dict() if found is not None else {}
        if pretrained_cfg.get("fixed_input_size"):
            size = pretrained_cfg["input_size"][-1]
            return size, size
        return (pretrained_cfg.get("min_input_size") or (1, 1, 1))[-1], None
    if target.endswith("create_torchvision_model"):
        import torchvision

        if name.startswith(TORCHVISION_FIXED_SIZE_PREFIXES):
            return 224, 224
        weights = list(torchvision.models.get_model_weights(name))
        return (weights[0].meta.get("min_size", (1, 1))[-1] if weights else 1), None
    return 1, None


class SmallCNN(nn.Module):
    """Conv3x3-BN-ReLU blocks (one per width), a 2x2 max-pool after the second, global average
    pooling, dropout, linear. Any input of at least 1x1 works: 8x8 digits, 28x28, 32x32."""

    def __init__(self, in_channels: int, num_classes: int, widths: Iterable[int] = (32, 64, 128), dropout: float = 0.0):
        super().__init__()
        layers, channels = [], in_channels
        for index, width in enumerate(widths):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            if index == 1:
                # ceil_mode keeps a 1x1 map at 1x1 (and 7x7 -> 4x4), so no size check per step.
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def create_timm_model(
    name: str,
    pretrained: bool = False,
    in_chans: int = 3,
    num_classes: int = 1000,
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
) -> nn.Module:
    """`timm.create_model` with config errors instead of stack traces for the usual mistakes."""
    import timm

    if not timm.is_model(name):
        raise ConfigError("model.name", f"timm has no model {name!r}{_did_you_mean(name, timm.list_models())}")
    options = {}
    # Passed only when asked for: not every model takes these arguments.
    if drop_rate > 0:
        options["drop_rate"] = drop_rate
    if drop_path_rate > 0:
        options["drop_path_rate"] = drop_path_rate
    try:
        return timm.create_model(name, pretrained=pretrained, in_chans=in_chans, num_classes=num_classes, **options)
    except TypeError as error:
        for key in ("drop_path_rate", "drop_rate"):
            if key in str(error):
                fix = "model.drop_path_rate=0" if key == "drop_path_rate" else "regularization.dropout=0"
                raise ConfigError(f"model.{key}", f"timm's {name} does not take {key}; set {fix}") from error
        raise
    except (OSError, RuntimeError) as error:
        if not pretrained:
            raise
        # Offline (HF_HUB_OFFLINE=1 or no network) and not in the cache, or no weights exist.
        reason = str(error).split(". ")[0]
        raise ConfigError(
            "model.pretrained",
            f"could not load pretrained weights for {name} ({type(error).__name__}: {reason}); "
            "download them once with network access (timm caches them under $HF_HOME/hub, by default "
            "~/.cache/huggingface/hub, and finds them there offline), or save a state dict "
            "(torch.save(timm.create_model(name, pretrained=True).state_dict(), path)) and set "
            "model.pretrained_path=<path> model.pretrained=false, or set model.pretrained=false",
        ) from error


def create_torchvision_model(name: str, in_channels: int = 3, num_classes: int = 1000, dropout: float = 0.0) -> nn.Module:
    """A torchvision classifier by name, randomly initialized, adapted to the data: the first
    convolution rebuilt for `in_channels`, dropout inserted before the last linear layer."""
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)  # classification models only
    if name not in known:
        raise ConfigError("model.name", f"torchvision has no classification model {name!r}{_did_you_mean(name, known)}")
    options = {}
    if name in ("googlenet", "inception_v3"):
        # No auxiliary heads (their training-mode output is a tuple the loop cannot use), and
        # the initialization torchvision asks to choose explicitly.
        options = {"aux_logits": False, "init_weights": True}
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **options)
    if in_channels != 3:
        conv_name, conv = find_modules(model, nn.Conv2d)[0]
        replace_module(model, conv_name, _conv_like(conv, in_channels=in_channels))
    if dropout > 0:
        linears = find_modules(model, nn.Linear)
        if not linears:
            raise ConfigError("model.dropout", f"{name} has no linear layer to put dropout before; set regularization.dropout=0")
        linear_name, linear = linears[-1]
        replace_module(model, linear_name, nn.Sequential(nn.Dropout(dropout), linear))
    return model


def find_modules(model: nn.Module, kind: type[nn.Module]) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every submodule of `kind`, in registration order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Swap the submodule at the dotted `name` (e.g. "features.0.0") for `new`."""
    parent_name, _, child_name = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child_name, new)


def _conv_like(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A fresh Conv2d like `conv` but with `in_channels` inputs (default initialization)."""
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    matches = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f"; did you mean {', '.join(matches)}?" if matches else ""



# ---- fine-tuning: the classifier head, local pretrained weights, freezing ----------------------


def head_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The parameters of the classifier head (empty if none is found).

    timm models: `model.get_classifier()`; models with a `.head` module (SmallCNN, your own):
    its parameters; anything else (torchvision): the last nn.Linear in registration order.
    """
    model = unwrap_model(model)
    if hasattr(model, "get_classifier"):
        head = model.get_classifier()
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
        raise ConfigError("model.pretrained_path", f"'{path}' does not hold a state dict (a mapping of names to tensors)")
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
        raise ConfigError("model.pretrained_path", f"{len(mismatched)} tensors in '{path}' have other shapes than the model's "
                                                   f"(e.g. {mismatched[0]}); the file holds weights for another architecture")
    if not set(state) & set(own):
        raise ConfigError("model.pretrained_path", f"no tensor name in '{path}' matches the model "
                                                   f"(file: {next(iter(state), 'empty')}, model: {next(iter(own))}); "
                                                   "the file holds weights for another model")
    if dropped:
        log.info(f"pretrained: dropped the classifier head (another number of classes), it starts fresh: {', '.join(dropped)}")
    result = model.load_state_dict(state, strict=False)

    def listed(keys: list[str]) -> str:
        return f"{len(keys)}" + (f" ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})" if keys else "")

    log.info(f"pretrained: loaded {len(set(state) & set(own))} tensors from {path}; "
             f"missing {listed(result.missing_keys)}, unexpected {listed(result.unexpected_keys)}")


def stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """What `model.freeze: N` counts: the model's top-level children that hold parameters, in
    registration order, up to (not including) the first one that holds a classifier-head
    parameter. Parameters held by the model itself (a ViT's cls_token, pos_embed) go with the
    first stage. Per model kind:

    - timm resnet18: conv1, bn1, layer1, layer2, layer3, layer4 (then fc, the head)
    - timm ViT: patch_embed, blocks (all of them: one child), norm (then head)
    - torchvision resnet18: conv1, bn1, layer1, ..., layer4; VGG/MobileNet/EfficientNet: features
    - SmallCNN: features (then head)

    Models that pack their whole backbone into one child have a single stage: N=1 is
    `backbone`, minus any non-head layers inside the head's own child.
    """
    model = unwrap_model(model)
    head = {id(p) for p in head_parameters(model)}
    found = []
    for name, child in model.named_children():
        params = list(child.parameters())
        if not params:
            continue
        if any(id(p) in head for p in params):
            break
        found.append((name, child))
    return found


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
            raise ConfigError("model.freeze", f"found no classifier head in {type(model).__name__} to keep training; "
                                              "use model.freeze=N (stages) or null")
        frozen = [p for p in model.parameters() if id(p) not in head]
    elif isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        found = stages(model)
        if spec > len(found):
            raise ConfigError("model.freeze", f"{type(model).__name__} has {len(found)} stages before its head "
                                              f"({', '.join(n for n, _ in found) or 'none'}); use at most {len(found)}, "
                                              "'backbone' or null")
        frozen = list(model.parameters(recurse=False))
        for _, child in found[:spec]:
            frozen += list(child.parameters())
    else:
        raise ConfigError("model.freeze", f"must be null, backbone or a number of stages >= 0, got {spec!r}")
    for param in frozen:
        param.requires_grad_(False)
    names = _frozen_module_names(model)
    if freeze_bn:
        inside = lambda name: any(r == "" or name == r or name.startswith(r + ".") for r in names)  # noqa: E731
        model.frozen_batchnorm_names = [name for name, module in model.named_modules()
                                        if isinstance(module, nn.modules.batchnorm._BatchNorm) and inside(name)]
    total = sum(p.numel() for p in model.parameters())
    count = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    log.info(f"froze {count:,} of {total:,} parameters ({spec}): {', '.join(n or '(whole model)' for n in names)}"
             f"{'; their BatchNorm statistics too' if freeze_bn else ''}")
    return names


def _frozen_module_names(module: nn.Module, prefix: str = "") -> list[str]:
    """The largest submodules whose parameters are all frozen (modules without parameters skipped)."""
    params = list(module.parameters())
    if not params:
        return []
    if not any(p.requires_grad for p in params):
        return [prefix]
    names = []
    for name, child in module.named_children():
        names += _frozen_module_names(child, f"{prefix}.{name}" if prefix else name)
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
