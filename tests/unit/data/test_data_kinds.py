"""Data of any shape: a Data option that is not images (tests/data_for_tests.DigitsTable) and targets in their
own dtype."""

import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import composed
from data_for_tests import DigitsTable
from trainkit.data import Data, build_data
from trainkit.data.datasets import ImageData
from trainkit.data.loaders import TensorLoader

CPU = torch.device("cpu")
TABLE = {
    "_target_": "data_for_tests.DigitsTable",
    "name": "digits_table",
    "num_classes": None,
    "val_fraction": 0.1,
    "test_fraction": 0.2,
    "split_seed": 0,
    "batch_size": 64,
    "eval_batch_size": 512,
    "num_workers": 0,
    "drop_last": False,
    "shuffle": True,
}


def test_a_table_builds_without_image_keys_keeps_float_targets_and_transforms_nothing():
    data = build_data(OmegaConf.create(TABLE), CPU, seed=0)
    features, targets = next(iter(data.train))
    assert features.shape == (64, 64) and targets.dtype == torch.float32
    assert (targets.frac() == 0.25).all()  # a cast to int64 would have cut the .25 off
    assert data.kind == "generic" and data.channels is None and data.mean is None and data.pad_id is None
    train_transform, eval_transform = data.transforms(None, None, False, CPU)
    assert isinstance(train_transform, nn.Identity) and isinstance(eval_transform, nn.Identity)


def test_the_image_option_owns_todays_batch_transform():
    data = build_data(composed().data, CPU, seed=0)
    train_transform, eval_transform = data.transforms(composed("augmentation=shift").augmentation, 8, False, CPU)
    assert type(train_transform).__name__ == "BatchTransform" and train_transform.training
    assert not eval_transform.training and eval_transform.padding == 0  # evaluation never augments
    assert issubclass(DigitsTable, Data) and not issubclass(DigitsTable, ImageData)


def test_tensor_loader_keeps_the_targets_dtype():
    for targets in (torch.rand(10), torch.arange(10, dtype=torch.uint8), torch.arange(10)):
        loader = TensorLoader(torch.rand(10, 3), targets, 4, shuffle=False)
        assert next(iter(loader))[1].dtype == targets.dtype
