"""The CIFAR-10 recipe on a timm ResNet-18 (experiment=cifar10_resnet) and its search: both the timm_torchvision and
the downloads rows list this file, so it goes with either."""

import pytest

from conftest import composed
from helpers import template_has
from trainkit.config.validation import validate


@pytest.mark.skipif(
    not template_has("hparams_search/cifar10_optuna.yaml"), reason="this clone has no hparams_search (sweeps trimmed)"
)
@pytest.mark.parametrize(
    "overrides",
    [
        # cifar10_optuna searches augmentation: choice(shift, basic) over this experiment
        ["experiment=cifar10_resnet", "hparams_search=cifar10_optuna", "augmentation=shift"],
        ["experiment=cifar10_resnet", "hparams_search=cifar10_optuna", "augmentation=basic"],
        ["hparams_search=cifar10_optuna", "augmentation=basic"],  # the search composes the experiment itself
    ],
)
def test_the_cifar10_recipe_and_its_search_may_flip_images(overrides):
    validate(composed(*overrides))
