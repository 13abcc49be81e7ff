"""Building the configured model (the small CNN, your own, any factory `_target_` names) and the size it takes.

train.py calls one function:

    model, input_size = build_model(cfg.model, cfg.finetune, image_size=cfg.data.image_size)

`cfg.model` (conf/model/*.yaml) names a factory in `_target_` and holds only its arguments, so
`hydra.utils.instantiate(cfg.model)` alone builds the network (in a notebook too). What is done to
the network after that sits apart, in `cfg.finetune` (conf/config.yaml):

    pretrained_path: null   # a local state dict (.pt/.pth/.safetensors or a trainkit checkpoint)
                            # loaded after building: see load_pretrained
    freeze: null            # null | backbone | N (the first N stages): see finetune.stages
    freeze_bn: true         # BatchNorm inside frozen parts keeps its running statistics
    input_size: null        # side length every batch is resized to (null: the data's size,
                            # raised to what the model needs, e.g. 224 for a ViT, or doubled
                            # until a library's model runs: see trainkit.models.input_size)

The fine-tuning helpers live in trainkit.models.finetune (head, freezing) and trainkit.models.pretrained (weights).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping

from torch import nn

from trainkit.models.finetune import freeze
from trainkit.models.input_size import resolve_input_size
from trainkit.models.pretrained import load_pretrained

log = logging.getLogger(__name__)


def build_model(model_config: Mapping, finetune: Mapping, image_size: int | None) -> tuple[nn.Module, int | None]:
    """Instantiate the configured model, load its weights and freeze what `finetune` says; return it
    and the side length to resize batches to (None for data that is not images: `image_size` None)."""
    import hydra.utils

    # _convert_="all": the factories get plain lists and dicts, not ListConfig.
    model = hydra.utils.instantiate(model_config, _convert_="all")
    if finetune.get("pretrained_path"):
        load_pretrained(model, finetune["pretrained_path"])
    # After loading: the head check sees the final model.
    freeze(model, finetune.get("freeze"), freeze_bn=finetune.get("freeze_bn", True))
    if image_size is None:
        return model, None
    return model, resolve_input_size(model_config, image_size, finetune.get("input_size"), model)


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
