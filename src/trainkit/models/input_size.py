"""The side length a model's batches are resized to: the data's size, raised to what the model needs (its library
metadata: a ViT takes exactly 224; or, for a library's models, one no-grad forward on the CPU, doubling the size until
the stem fits), or an explicit `finetune.input_size` checked against the same limits.

A model factory says what it knows beside its code, as function attributes: `input_size_limits`, a function of its own
arguments (`name`) giving (the smallest side, the one fixed side or None), and `probe_input_size = True` where its
models' forward fails on small inputs for size reasons only. A built model's own `pretrained_cfg` (timm's metadata) wins
over both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from trainkit.config.validation import imported_target
from trainkit.errors import ConfigError
from trainkit.models.submodules import find_modules

log = logging.getLogger(__name__)


def resolve_input_size(
    model_config: Mapping, image_size: int, input_size: int | None = None, model: nn.Module | None = None
) -> int:
    """The explicit `input_size` if set, else `image_size` raised to the model's minimum (or its one fixed size).
    Checks an explicit size against what the model accepts.

    The library metadata misses many minimums (timm's convnext_atto has none, yet its 4x4 stem and 2x2 downsampling
    layers need 32x32), so a built model of a library (its factory's `probe_input_size`, or timm's `pretrained_cfg`)
    is also tried (see `runs_on`): a null `input_size` is doubled until the model runs, an explicit one that does not
    run is a config error naming a size that does."""
    minimum, fixed = input_size_limits(model_config, model)
    name = model_config.get("name", model_config.get("_target_", "this model"))
    if input_size is not None and fixed and input_size != fixed:
        raise ConfigError(
            "finetune.input_size", f"{name} takes only {fixed}x{fixed} inputs; set finetune.input_size=null or {fixed}"
        )
    if input_size is not None and input_size < minimum:
        raise ConfigError(
            "finetune.input_size",
            f"{name} needs inputs of at least {minimum}x{minimum}; set finetune.input_size=null or >= {minimum}",
        )
    size = input_size if input_size is not None else fixed or max(image_size, minimum)
    library = getattr(imported_target(model_config), "probe_input_size", False) or hasattr(model, "pretrained_cfg")
    if model is None or fixed or not library:
        return size
    working, error = smallest_working_size(model, size)
    if working == size:
        return size
    if input_size is not None:
        fix = f"null or a size it runs on, e.g. {working}" if working is not None else "null"
        raise ConfigError(
            "finetune.input_size",
            f"{name} does not run on {size}x{size} inputs ({_reason(error)}); set finetune.input_size={fix}",
        )
    if working is None:
        raise ConfigError(
            "finetune.input_size",
            f"{name} does not run on {size}x{size} inputs ({_reason(error)}) nor on any size up to "
            f"{MAX_PROBE_SIZE}; set finetune.input_size to a side length it takes",
        )
    log.info(f"{name} does not run on {size}x{size} inputs: batches are resized to {working}x{working}")
    return working


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


def _reason(error: BaseException | None) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def input_size_limits(model_config: Mapping, model: nn.Module | None = None) -> tuple[int, int | None]:
    """(smallest side length the model accepts, its one fixed size or None), from the model's
    library metadata, without building the model (pass `model` when you have it: its own
    metadata wins). Models whose factory declares no `input_size_limits` accept any size: (1, None)."""
    pretrained_cfg = getattr(model, "pretrained_cfg", None)
    if pretrained_cfg is not None:
        return limits_of_pretrained_cfg(pretrained_cfg)
    limits = getattr(imported_target(model_config), "input_size_limits", None)
    if callable(limits):
        return limits(model_config.get("name"))
    return 1, None


def limits_of_pretrained_cfg(pretrained_cfg: Mapping) -> tuple[int, int | None]:
    """(smallest side, fixed side or None) that timm's metadata of a model (`pretrained_cfg`) states."""
    if pretrained_cfg.get("fixed_input_size"):
        size = pretrained_cfg["input_size"][-1]
        return size, size
    return (pretrained_cfg.get("min_input_size") or (1, 1, 1))[-1], None
