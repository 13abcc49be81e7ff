"""`hydra.utils.instantiate` builds every model, data and task option from the composed config
alone, as in a notebook: each node holds only its class's arguments (what build_model does after
that sits in the `finetune` section), so `_target_` means one thing everywhere.

The options are read from conf/, so an option added there is covered here without an edit.
"""

import dataclasses
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from conftest import composed, made_for, options
from trainkit.config.declared import answer, arguments, parameters
from trainkit.data import Data, ImageData, Splits
from trainkit.tasks import Task

# Keys a data option leaves null until its data is built (a tokenizer's ids and padding, a folder's classes), which
# a model of that data reads: a byte tokenizer's and two classes here.
FILLED_WHEN_BUILT = {"vocabulary": 257, "pad_id": 0, "num_classes": 2}
# A model that needs a key the option leaves for the command line (model=hf: model.path or model.config).
TINY_BERT = "model.config={model_type: bert, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}"
KEYS_OF_MODEL = {"hf": [TINY_BERT]}


def an_image(in_channels: int) -> torch.Tensor:
    """One image of `in_channels` channels, 32 pixels a side: what an image model's forward takes."""
    return torch.zeros(1, in_channels, 32, 32)


def example_input(model_config) -> Any:
    """What a model takes, for a batch of one (docs/models.md): its `example_input`, asked with the option's values,
    else an image of its `in_channels`; None where it says nothing of its input."""
    from hydra.utils import get_object

    owner = get_object(model_config._target_)
    if callable(getattr(owner, "example_input", None)):
        return answer(owner, "example_input", model_config)[1]
    if "in_channels" in parameters(owner):
        given = arguments(owner, an_image, model_config)
        return None if given is None else an_image(**given)
    return None


@pytest.mark.parametrize("option", options("model"))
def test_every_model_option_instantiates_to_a_module_that_takes_its_example_input(option):
    """The model the option describes, with the data made for it (made_for: the data option that names it), runs
    on what it says it takes (example_input above: its example_input, or an image of its in_channels)."""
    cfg = composed(f"model={option}", *made_for(f"model={option}"), *KEYS_OF_MODEL.get(option, []))
    for key, value in FILLED_WHEN_BUILT.items():
        if key in cfg.data and cfg.data[key] is None:
            cfg.data[key] = value
    model = instantiate(cfg.model)
    assert isinstance(model, nn.Module)
    example = example_input(cfg.model)
    assert example is not None, f"{cfg.model._target_} says nothing of its input: give it a static example_input"
    with torch.no_grad():
        model.eval()
        outputs = (
            model(**example)
            if isinstance(example, dict)
            else model(*example)
            if isinstance(example, tuple)
            else model(example)
        )
    outputs = outputs[0] if isinstance(outputs, tuple) else outputs
    assert outputs.shape[0] == 1 and torch.isfinite(outputs.float()).all()  # a batch of one in, one out


@pytest.mark.parametrize("option", options("data"))
def test_every_data_option_instantiates_to_its_dataclass_with_the_options_keys(option):
    cfg = composed(f"data={option}", *made_for(f"data={option}"))
    data = instantiate(cfg.data)
    assert isinstance(data, Data) and type(data).__name__ == cfg.data._target_.rsplit(".", 1)[1]
    keys = {key for key in cfg.data if key != "_target_"}
    assert keys <= {field.name for field in dataclasses.fields(data)}
    assert {key: getattr(data, key) for key in keys} == {key: cfg.data[key] for key in keys}
    if not data.uses_root and data.in_memory and not any(key.startswith("data.") for key in made_for(f"data={option}")):
        splits = data.splits()  # generated or shipped, in memory: made here too
        assert isinstance(splits, Splits)
        images, labels = splits.train
        if isinstance(data, ImageData):  # other data has no image keys to hold its shape to
            assert images.shape[1:] == (cfg.data.channels, cfg.data.image_size, cfg.data.image_size)
        assert len(images) == len(labels) > 0 and splits.num_classes == (cfg.data.num_classes or splits.num_classes)


@pytest.mark.parametrize("option", options("task"))
def test_every_task_option_instantiates_to_a_task(option):
    cfg = composed(f"task={option}")
    assert isinstance(instantiate(cfg.task), Task)
