"""The side length a model's batches are resized to: the data's size, raised to what the model
needs (its library metadata: a ViT takes exactly 224; or, for timm and torchvision models, one
no-grad forward on the CPU, doubling the size until the stem fits), or an explicit
`finetune.input_size` checked against the same limits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from trainkit.errors import ConfigError
from trainkit.models.submodules import find_modules

log = logging.getLogger(__name__)

# torchvision models that, built without weights, take exactly 224x224 inputs (their own
# metadata only gives a minimum, and vit_h_14's first weights even say 518).
TORCHVISION_FIXED_SIZE_PREFIXES = ("vit_", "maxvit_")


def resolve_input_size(
    model_config: Mapping, image_size: int, input_size: int | None = None, model: nn.Module | None = None
) -> int:
    """The explicit `input_size` if set, else `image_size` raised to the model's minimum (or
    its one fixed size). Checks an explicit size against what the model accepts.

    The library metadata misses many minimums (timm's convnext_atto has none, yet its 4x4 stem
    and 2x2 downsampling layers need 32x32), so a built timm or torchvision model is also tried
    (see `runs_on`): a null `input_size` is doubled until the model runs, an explicit one that
    does not run is a config error naming a size that does."""
    minimum, fixed = input_size_limits(model_config, model)
    name = model_config.get("name", model_config.get("_target_", "this model"))
    probe = model is not None and not fixed and _is_library_model(model_config, model)
    if input_size is None:
        size = fixed or max(image_size, minimum)
        if probe:
            assert model is not None  # for mypy: probe implies a model
            working, error = smallest_working_size(model, size)
            if working is None:
                raise ConfigError(
                    "finetune.input_size",
                    f"{name} does not run on {size}x{size} inputs ({_reason(error)}) nor on any size up to "
                    f"{MAX_PROBE_SIZE}; set finetune.input_size to a side length it takes",
                )
            if working != size:
                log.info(f"{name} does not run on {size}x{size} inputs: batches are resized to {working}x{working}")
            size = working
        return size
    if fixed and input_size != fixed:
        raise ConfigError(
            "finetune.input_size", f"{name} takes only {fixed}x{fixed} inputs; set finetune.input_size=null or {fixed}"
        )
    if input_size < minimum:
        raise ConfigError(
            "finetune.input_size",
            f"{name} needs inputs of at least {minimum}x{minimum}; set finetune.input_size=null or >= {minimum}",
        )
    if probe:
        assert model is not None
        error = runs_on(model, input_size)
        if error is not None:
            working, _ = smallest_working_size(model, input_size * 2)
            fix = f"null or a size it runs on, e.g. {working}" if working is not None else "null"
            raise ConfigError(
                "finetune.input_size",
                f"{name} does not run on {input_size}x{input_size} inputs ({_reason(error)}); "
                f"set finetune.input_size={fix}",
            )
    return input_size


# The largest side length smallest_working_size tries: beyond it, the model is broken, not small-input shy.
MAX_PROBE_SIZE = 1024


def runs_on(model: nn.Module, size: int) -> Exception | None:
    """Try one forward pass of a batch of one `size`x`size` image on the model's device (the CPU,
    in build_model) without gradients, in eval mode (modes put back after, torch's RNG untouched);
    None if it ran, else the error it raised."""
    parameter = next(model.parameters(), None)
    convs = find_modules(model, nn.Conv2d)
    channels = convs[0][1].in_channels if convs else 3
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    modes = [(module, module.training) for module in model.modules()]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            model(torch.zeros(1, channels, size, size, device=device, dtype=dtype))
        return None
    except (RuntimeError, ValueError, AssertionError, IndexError) as error:  # what too small an input raises
        return error
    finally:
        for module, training in modes:
            module.training = training


def smallest_working_size(model: nn.Module, start: int) -> tuple[int | None, Exception | None]:
    """(`start`, doubled until the model runs on it, or None past MAX_PROBE_SIZE; the first error)."""
    size, first_error = max(1, start), None
    while size <= MAX_PROBE_SIZE:
        error = runs_on(model, size)
        if error is None:
            return size, first_error
        first_error = first_error or error
        size *= 2
    return None, first_error


def _is_library_model(model_config: Mapping, model: nn.Module) -> bool:
    """timm and torchvision models: their forward fails on small inputs for size reasons only."""
    target = str(model_config.get("_target_", ""))
    return target.endswith(("create_timm_model", "create_torchvision_model")) or hasattr(model, "pretrained_cfg")


def _reason(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


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

            assert name is not None, "a timm model config names its model (model.name)"
            found = get_pretrained_cfg(name)
            pretrained_cfg = found.to_dict() if found is not None else {}
        if pretrained_cfg.get("fixed_input_size"):
            size = pretrained_cfg["input_size"][-1]
            return size, size
        return (pretrained_cfg.get("min_input_size") or (1, 1, 1))[-1], None
    if target.endswith("create_torchvision_model"):
        import torchvision

        assert name is not None, "a torchvision model config names its model (model.name)"
        if name.startswith(TORCHVISION_FIXED_SIZE_PREFIXES):
            return 224, 224
        weights = list(torchvision.models.get_model_weights(name))
        return (weights[0].meta.get("min_size", (1, 1))[-1] if weights else 1), None
    return 1, None
