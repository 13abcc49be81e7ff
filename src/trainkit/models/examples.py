"""What a model takes: an example input for a batch of one, which the quick tests call every model option with
(tests/unit/config/test_instantiate.py), so a model of two inputs, of token ids or of table rows is called as
it is meant to be.

A model (its class, or its factory function as an attribute) says what its forward takes in a static
`example_input`, whose parameters are named after the model's own arguments as `config_problems`' are: a tensor
(one input), a tuple (positional inputs) or a dict (keyword inputs). A model that takes `in_channels` and
declares none takes one batch of images, [1, in_channels, H, W].
"""

from typing import Any

import torch
from omegaconf import DictConfig

from trainkit.config.declared import answer, arguments, parameters


def an_image(in_channels: int) -> torch.Tensor:
    """One image of `in_channels` channels, 32 pixels a side: what an image model's forward takes."""
    return torch.zeros(1, in_channels, 32, 32)


def token_ids() -> torch.Tensor:
    """One sequence of 8 token ids: what a model of token sequences takes."""
    return torch.zeros(1, 8, dtype=torch.int64)


def example_input(model_config: DictConfig) -> Any:
    """The example input of the model `model_config` describes (its `example_input`, asked with the option's
    values; an image of its `in_channels` where it declares none); None where it says nothing of its input."""
    from hydra.utils import get_object

    owner = get_object(model_config._target_)
    if callable(getattr(owner, "example_input", None)):
        return answer(owner, "example_input", model_config)[1]
    if "in_channels" in parameters(owner):
        given = arguments(owner, an_image, model_config)
        return None if given is None else an_image(**given)  # type: ignore[arg-type]
    return None
