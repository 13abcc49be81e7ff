"""trainkit.models.unet: logits at the input size, and a clear error for a size it cannot halve."""

import pytest
import torch

from trainkit.models.unet import UNet


@pytest.mark.parametrize(("widths", "height", "width"), [((8, 16, 32), 32, 48), ((8,), 7, 5), ((4, 8, 16, 32), 16, 8)])
def test_unet_returns_logits_at_the_input_size(widths, height, width):
    model = UNet(in_channels=3, num_classes=5, widths=widths, dropout=0.1).eval()
    assert model(torch.rand(2, 3, height, width)).shape == (2, 5, height, width)


def test_unet_refuses_a_size_its_levels_cannot_halve():
    with pytest.raises(ValueError, match="divisible by 4"):
        UNet(in_channels=1, num_classes=2, widths=(8, 16, 32))(torch.rand(1, 1, 30, 32))


def test_the_config_check_asks_the_unet_what_its_input_size_must_be_divisible_by():
    from omegaconf import OmegaConf

    from trainkit.config.declared import answer

    assert answer(UNet, "input_size_multiple", OmegaConf.create({"widths": [8, 16, 32, 64]})) == (None, 8)
