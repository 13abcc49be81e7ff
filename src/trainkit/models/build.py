"""Building the configured model (the small CNN, your own, any factory `_target_` names).

`cfg.model` (conf/model/*.yaml) names a factory in `_target_` and holds only its arguments, so
`hydra.utils.instantiate(cfg.model)` alone builds the network (in a notebook too): `build_model(cfg.model)`.
What fine-tuning does to it after that (weights, freezing, the input size) is trainkit.models.finetune's.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from torch import nn


def build_model(model_config: Mapping) -> nn.Module:
    """Instantiate the configured model."""
    import hydra.utils

    # _convert_="all": the factories get plain lists and dicts, not ListConfig.
    return hydra.utils.instantiate(model_config, _convert_="all")


def _conv_like(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A fresh Conv2d like `conv` but with `in_channels` inputs (default initialization)."""
    # A Conv2d holds 2-tuples; torch annotates them as tuple[int, ...], shared with Conv1d and Conv3d.
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,  # type: ignore[arg-type]
        stride=conv.stride,  # type: ignore[arg-type]
        padding=conv.padding,  # type: ignore[arg-type]
        dilation=conv.dilation,  # type: ignore[arg-type]
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )


# Shown where a misspelt model name is close to none of a library's hundreds of names.
WELL_KNOWN_MODELS = ("resnet18", "resnet50", "convnext_tiny", "efficientnet_b0", "vit_small_patch16_224", "vit_b_16")


def _did_you_mean(name: str, choices: Iterable[str], listing: str = "") -> str:
    """The close names of `choices`; else all of them where they are few, else a few well-known ones
    and `listing`, the command that prints them all."""
    choices = list(choices)
    matches = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if matches:
        return f"; did you mean {', '.join(matches)}?"
    if len(choices) <= 12:
        return f"; choose one of {', '.join(sorted(choices))}"
    examples = ", ".join(model for model in WELL_KNOWN_MODELS if model in choices)
    listed = f"; list them with {listing}" if listing else ""
    return f"; none of its {len(choices)} names is close (e.g. {examples}){listed}"
