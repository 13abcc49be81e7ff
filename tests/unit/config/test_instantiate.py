"""`hydra.utils.instantiate` builds every model, data and task option from the composed config
alone, as in a notebook: each node holds only its class's arguments (what build_model does after
that sits in the `finetune` section), so `_target_` means one thing everywhere.

The options are read from conf/, so an option added there is covered here without an edit.
"""

import dataclasses

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from conftest import ROOT, composed
from trainkit.data import Data, FileSplits, ImageData, Splits
from trainkit.tasks import Task

# Data options that read a folder: data.root is `???` until given (nothing is read by instantiate).
NEEDS_A_FOLDER = {
    "imagefolder": ["data.root=/nonexistent/images"],
    "cached": ["data.root=/nonexistent/cache"],
    "textfolder": ["data.root=/nonexistent/texts"],
    "hf": ["data.path=/nonexistent/reviews.jsonl"],
}
# In memory and without files: splits() runs here too.
GENERATED_OR_SHIPPED = ("digits", "synthetic", "shapes")


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (ROOT / "conf" / group).glob("*.yaml"))


# Models of token data read their sizes from a data option of that kind (model=gpt: data.block_size), and the ids
# and padding of its tokenizer, which building the data fills in (null until then): bytes' here.
DATA_OF_MODEL = {
    "gpt": ["data=text", "data.vocabulary=256"],
    "sequence": ["data=stdlib_functions", "data.vocabulary=257", "data.pad_id=0"],
    "hf": ["data=stdlib_functions", "data.vocabulary=257", "data.pad_id=0"],
}
# A model that needs a key the option leaves for the command line (model=hf: model.path or model.config).
TINY_BERT = "model.config={model_type: bert, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}"
KEYS_OF_MODEL = {"hf": [TINY_BERT]}


@pytest.mark.parametrize("option", options("model"))
def test_every_model_option_instantiates_to_a_module(option):
    cfg = composed(f"model={option}", *DATA_OF_MODEL.get(option, ["data=digits"]), *KEYS_OF_MODEL.get(option, []))
    model = instantiate(cfg.model)
    assert isinstance(model, nn.Module)
    reads_images = "${data.channels}" in (ROOT / "conf" / "model" / f"{option}.yaml").read_text()
    if option == "signal":  # 1-D signals of the data's channels and their lengths (docs/recipes.md), a score each out
        with torch.no_grad():
            outputs = model.eval()(signal=torch.zeros(1, cfg.data.channels, 8), lengths=torch.tensor([5]))
        assert outputs.shape == (1, cfg.data.num_classes)
        return
    if not reads_images:  # a model of another kind of data (token sequences): token ids in, a score each out
        with torch.no_grad():
            outputs = model.eval()(torch.zeros(1, 8, dtype=torch.int64))
        classes = next(cfg.model[key] for key in ("num_classes", "num_labels", "vocab_size") if key in cfg.model)
        assert outputs.shape[0] == 1 and outputs.shape[-1] == classes
        return
    with torch.no_grad():  # the network the config describes: the data's channels in, its classes out
        outputs = model.eval()(torch.zeros(1, cfg.data.channels, 32, 32))
    assert outputs.shape[:2] == (1, cfg.data.num_classes)


@pytest.mark.parametrize("option", options("data"))
def test_every_data_option_instantiates_to_its_dataclass_with_the_options_keys(option):
    cfg = composed(f"data={option}", *NEEDS_A_FOLDER.get(option, []))
    data = instantiate(cfg.data)
    assert isinstance(data, Data) and type(data).__name__ == cfg.data._target_.rsplit(".", 1)[1]
    keys = {key for key in cfg.data if key != "_target_"}
    assert keys <= {field.name for field in dataclasses.fields(data)}
    assert {key: getattr(data, key) for key in keys} == {key: cfg.data[key] for key in keys}
    if option in GENERATED_OR_SHIPPED:
        splits = data.splits()
        assert isinstance(splits, Splits if data.in_memory else FileSplits)
        images, labels = splits.train
        if isinstance(data, ImageData):  # other data has no image keys to hold its shape to
            assert images.shape[1:] == (cfg.data.channels, cfg.data.image_size, cfg.data.image_size)
        assert len(images) == len(labels) > 0 and splits.num_classes == (cfg.data.num_classes or splits.num_classes)


@pytest.mark.parametrize("option", options("task"))
def test_every_task_option_instantiates_to_a_task(option):
    cfg = composed(f"task={option}")
    assert isinstance(instantiate(cfg.task), Task)
