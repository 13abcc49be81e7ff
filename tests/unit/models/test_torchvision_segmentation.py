"""trainkit.models.torchvision_segmentation: torchvision's segmentation models give per-pixel logits
[B, num_classes, H, W] for the data's channels, and a misspelt name is a config error."""

import pytest
import torch

from trainkit.errors import ConfigError
from trainkit.models.submodules import head_parameters
from trainkit.models.torchvision_segmentation import TorchvisionSegmentation


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large", "fcn_resnet50"])
def test_returns_logits_at_the_input_size_for_the_data_channels(name):
    model = TorchvisionSegmentation(name, in_channels=1, num_classes=4).eval()
    with torch.no_grad():
        logits = model(torch.rand(2, 1, 32, 48))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 4, 32, 48)  # the "out" tensor, not the dict


def test_has_no_auxiliary_head():
    model = TorchvisionSegmentation("fcn_resnet50", num_classes=3)
    assert model.model.aux_classifier is None  # nothing would train it


def test_an_unknown_name_is_a_config_error_with_suggestions():
    with pytest.raises(ConfigError, match="did you mean lraspp_mobilenet_v3_large") as error:
        TorchvisionSegmentation("lraspp_mobilenet_v3", num_classes=3)
    assert error.value.key == "model.name"
    with pytest.raises(ConfigError, match="; choose one of deeplabv3_mobilenet_v3_large, deeplabv3_resnet101, "):
        TorchvisionSegmentation("unet", num_classes=3)


def test_the_head_is_the_per_pixel_classifier():
    """What freezing the backbone (fine-tuning) leaves training and optimizer.head_lr_scale scales."""
    model = TorchvisionSegmentation("lraspp_mobilenet_v3_large", num_classes=3)
    head = head_parameters(model)
    names = {name for name, parameter in model.named_parameters() if parameter in head}
    assert names and all(name.startswith("model.classifier.") for name in names)
