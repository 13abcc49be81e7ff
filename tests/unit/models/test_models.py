"""Models: the small CNN built from its config."""

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from trainkit.models.build import build_model
from trainkit.models.small_cnn import SmallCNN

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # conftest sets it too; never reach for the hub
CONF = Path(__file__).resolve().parents[3] / "conf"


def model_config(group: str, channels: int = 1, image_size: int = 8, dropout: float = 0.0, **overrides):
    """conf/model/<group>.yaml inside a root config that its interpolations resolve against."""
    root = OmegaConf.create(
        {
            "data": {"channels": channels, "num_classes": 10, "image_size": image_size},
            "regularization": {"dropout": dropout},
            "model": OmegaConf.load(CONF / "model" / f"{group}.yaml"),
        }
    )
    for key, value in overrides.items():
        root.model[key] = value
    return root.model


@pytest.mark.parametrize(("channels", "size"), [(1, 8), (1, 28), (3, 32), (3, 1)])
def test_small_cnn_takes_digits_mnist_and_cifar_sizes(channels, size):
    model = SmallCNN(in_channels=channels, num_classes=10, widths=(8, 16, 32), dropout=0.25)
    assert model(torch.randn(4, channels, size, size)).shape == (4, 10)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25]


def test_build_model_builds_the_cnn_from_its_config():
    model = build_model(model_config("cnn", dropout=0.1))
    assert isinstance(model, SmallCNN)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.1]
