"""The config check of task=segmentation, model=unet, model=torchvision_segmentation and data=shapes: what their
classes declare beside their code (one class per pixel, the sizes the U-Net halves, each one's own keys), gathered as
a task or model of yours would be."""

import pytest

from conftest import composed
from trainkit.config.validation import problems, validate
from trainkit.errors import ConfigError

SEGMENTATION = ["task=segmentation", "optimized_metric=val/miou", "data.mirror_changes_label=false"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["experiment=shapes_segmentation", "task.class_names=[background,circle]"], "task.class_names"),
        # a target per pixel: what moves the image must move the mask
        ([*SEGMENTATION, "augmentation=shift"], "augmentation.crop_padding"),
        (["task=segmentation", "optimized_metric=val/miou"], "task.horizontal_flip"),  # digits: a mirrored 2 is no 2
        # a model with one class per pixel needs a task with one target per pixel
        (["model=unet"], "model._target_"),
        (["model=torchvision_segmentation"], "model._target_"),
        # the U-Net halves the size once a level: its class says what the side must be divisible by
        (["experiment=shapes_segmentation", "data.image_size=30"], "data.image_size"),
        # each one's config_rules: what its arguments may hold
        (["model=torchvision_segmentation", *SEGMENTATION, "model.name=3"], "model.name"),
        (["experiment=shapes_segmentation", "model.widths=[0,8]"], "model.widths"),
        (["experiment=shapes_segmentation", "task.crop_padding=1"], "task.crop_padding"),
        (["experiment=shapes_segmentation", "task.horizontal_flip=maybe"], "task.horizontal_flip"),
        (["experiment=shapes_segmentation", "data.num_samples=0"], "data.num_samples"),
        (["experiment=shapes_segmentation", "data.val_samples=0"], "data.val_samples"),
        (["experiment=shapes_segmentation", "data.test_samples=-5"], "data.test_samples"),
        (["experiment=shapes_segmentation", "data.noise=-1"], "data.noise"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_every_mistake_is_one_config_error_naming_its_key(overrides, key):
    cfg = composed(*overrides)
    assert list(problems(cfg)) == [key]
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert error.value.key == key and str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


def test_a_per_pixel_model_with_classification_names_the_task_that_fits_it():
    message = problems(composed("model=unet"))["model._target_"]
    assert "use a task with one target per pixel (task=segmentation or experiment=shapes_segmentation)" in message


def test_the_input_size_the_unet_takes_comes_from_its_class_and_its_options_settings():
    """UNet.input_size_multiple(widths): 2 ** (levels - 1), asked with model.widths before any directory exists."""
    deeper = composed("experiment=shapes_segmentation", "model.widths=[8,16,32,64]", "data.image_size=36")
    assert problems(deeper) == {
        "data.image_size": "is 36, but trainkit.models.unet.UNet (model.widths=[8, 16, 32, 64]) takes sizes divisible "
        "by 8; use data.image_size=32 or 40, or a model that halves the size fewer times"
    }
    assert problems(composed("experiment=shapes_segmentation", "model.widths=[8]", "data.image_size=30")) == {}


def test_the_shapes_need_no_download_and_no_root():
    assert composed("data=shapes").data.get("root") is None
