"""Local pretrained weights for a model that differs from the file's only where fine-tuning makes
it differ: another classifier head (dropped), another number of input channels (adapted).

trainkit.models.finetune's `fine_tune` calls `load_pretrained` for `finetune.pretrained_path`. The weights are
read from a file, never downloaded: .safetensors, a torch.save'd state dict, or a checkpoint.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainkit.errors import ConfigError
from trainkit.models.submodules import find_modules, head_parameters

log = logging.getLogger(__name__)


def _first_conv_weight_name(model: nn.Module) -> str | None:
    """State-dict key of the stem convolution: timm names it in pretrained_cfg, else the first Conv2d."""
    first_conv = (getattr(model, "pretrained_cfg", None) or {}).get("first_conv")
    if isinstance(first_conv, str):
        return f"{first_conv}.weight"
    convs = find_modules(model, nn.Conv2d)
    return f"{convs[0][0]}.weight" if convs else None


def adapt_input_channels(weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """A conv weight [out, c, k, k] made to take `in_channels` inputs (timm's rule): one channel gets the sum over the
    file's channels (grey = a mix of R, G, B, so the response to a grey image stays the same); more channels repeat the
    file's channels cyclically, scaled by c / in_channels so the activations keep their size."""
    file_channels = weight.shape[1]
    if in_channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeated = weight.repeat(1, math.ceil(in_channels / file_channels), 1, 1)[:, :in_channels]
    return repeated * (file_channels / in_channels)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors by name from a .safetensors file, a torch.save'd state dict, or a checkpoint
    holding one under "model" or "state_dict" (trainkit, Lightning, most repositories).
    Pickled files load with weights_only=True: no code from the file runs."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            "finetune.pretrained_path",
            f"no file at '{path}'; download the weights on a machine with network (e.g. "
            "torch.save(timm.create_model(name, pretrained=True).state_dict(), path)) and point "
            "finetune.pretrained_path at it",
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
            "finetune.pretrained_path",
            f"could not read '{path}' ({type(error).__name__}: {reason}); save weights with "
            "torch.save(model.state_dict(), path) or safetensors.torch.save_file",
        ) from error
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            "finetune.pretrained_path", f"'{path}' does not hold a state dict (a mapping of names to tensors)"
        )
    # `module.` (DDP) and `_orig_mod.` (torch.compile), in any nesting, come off the front.
    return {re.sub(r"^(?:module\.|_orig_mod\.)+", "", key): value for key, value in state.items()}


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
    head = {id(p) for p in head_parameters(model)}
    head_names = {name for name, param in model.named_parameters() if id(param) in head}
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
            "finetune.pretrained_path",
            f"{len(mismatched)} tensors in '{path}' have other shapes than the model's "
            f"(e.g. {mismatched[0]}); the file holds weights for another architecture",
        )
    if not set(state) & set(own):
        raise ConfigError(
            "finetune.pretrained_path",
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
