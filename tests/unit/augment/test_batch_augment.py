"""augmentation=strong (trainkit.augment.batch_augment): each op, drawn per sample, as
BatchTransform runs it on training batches."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from trainkit.augment.batch_augment import augmentation_ops
from trainkit.augment.batch_transform import BatchTransform

CONF = Path(__file__).resolve().parents[3] / "conf" / "augmentation"
CHECKS = {"batch_augment": "trainkit.augment.batch_augment"}  # what conf/augmentation/strong.yaml names


def preset(name: str):
    return OmegaConf.load(CONF / f"{name}.yaml")


def identity_transform(size: int, augmentation=None, channels: int = 1) -> BatchTransform:
    """mean 0, std 1: the output is the [0, 1] image itself, easy to compare."""
    if isinstance(augmentation, dict):
        augmentation = {**augmentation, "_checks_": CHECKS}
    return BatchTransform(
        mean=(0.0,) * channels, std=(1.0,) * channels, size=size, augmentation=augmentation, train=True
    )


def asymmetric_images(batch: int, size: int = 8, channels: int = 1) -> torch.Tensor:
    """Random images in (0, 1]: no zeros (so padding is recognizable) and no mirror symmetry."""
    torch.manual_seed(123)
    return torch.rand(batch, channels, size, size) * 0.9 + 0.1


def test_eval_mode_is_deterministic_and_does_not_augment():
    images = asymmetric_images(32)
    for transform in (
        BatchTransform(mean=(0.0,), std=(1.0,), size=8, augmentation=preset("strong"), train=False),
        identity_transform(8, preset("strong")).eval(),
    ):
        assert not transform.training
        torch.testing.assert_close(transform(images), images, rtol=0, atol=0)
        torch.testing.assert_close(transform(images), transform(images), rtol=0, atol=0)


def test_does_not_modify_the_input():
    images = asymmetric_images(16, channels=3)
    copy = images.clone()
    identity_transform(8, preset("strong"), channels=3)(images)
    assert torch.equal(images, copy)


def test_color_jitter_changes_colours_per_sample_but_not_geometry():
    # Every column has one colour, varying across columns and samples.
    torch.manual_seed(0)
    images = torch.rand(64, 3, 1, 8).expand(-1, -1, 8, -1).contiguous()
    jitter = {"name": "strong", "color_jitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4}}
    out = identity_transform(8, jitter, channels=3)(images)
    assert out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out, out[:, :, :1].expand_as(out), rtol=0, atol=0)  # columns stay columns
    ratios = (out / images)[:, :, 0, 0]  # one sample's factor differs from another's
    assert ratios.std(dim=0).min() > 1e-3
    # One channel: brightness and contrast still apply, saturation is skipped.
    grey = identity_transform(8, jitter)(images[:, :1])
    assert grey.shape == (64, 1, 8, 8) and not torch.allclose(grey, images[:, :1])


def test_affine_moves_pixels_with_a_different_transform_per_sample():
    images = asymmetric_images(16, channels=3)
    affine = {"name": "strong", "affine": {"degrees": 15, "translate": 0.1, "scale": [0.9, 1.1], "shear": 10}}
    out = identity_transform(8, affine, channels=3)(images)
    assert out.shape == images.shape and out.min() >= 0 and out.max() <= 1
    assert not torch.allclose(out, images)
    copies = identity_transform(8, affine, channels=3)(images[:1].expand(16, -1, -1, -1))
    assert (copies - copies[:1]).abs().amax(dim=(1, 2, 3))[1:].min() > 1e-3  # one image, 16 different draws


def test_random_order_is_drawn_per_sample():
    """A constant grey image tells the two orders apart at its centre pixel.

    Contrast jitter leaves a constant image unchanged, so jitter-then-affine gives 0.5 at the
    centre. Shrinking by half first adds black borders, which lower the image mean, so the
    contrast blend then moves the centre away from 0.5 (the factor is never exactly 1).
    """
    images = torch.full((128, 1, 8, 8), 0.5)
    options = {"name": "strong", "color_jitter": {"contrast": 0.5}, "affine": {"scale": [0.5, 0.5]}}
    centre = identity_transform(8, {**options, "random_order": True})(images)[:, 0, 3:5, 3:5]
    jitter_first = (centre - 0.5).abs().amax(dim=(1, 2)) < 1e-6
    assert 0.3 < jitter_first.float().mean().item() < 0.7, "both orders occur in one batch"
    fixed = identity_transform(8, {**options, "random_order": False})(images)[:, 0, 3:5, 3:5]
    torch.testing.assert_close(fixed, torch.full_like(fixed, 0.5))  # fixed order: jitter first


RECIPES = sorted(path.stem for path in CONF.glob("*.yaml"))
# This module's ops; a recipe's other keys are the core's (crop_padding, horizontal_flip) or another module's.
BATCH_OPS = {"color_jitter", "affine", "random_erasing"}


@pytest.mark.parametrize("name", RECIPES)
def test_every_op_a_recipe_sets_is_on_and_a_recipe_with_batch_ops_changes_the_batch(name):
    recipe = preset(name)
    set_keys = {key for key, value in recipe.items() if value and key in BATCH_OPS}
    assert set(augmentation_ops(recipe)) == set_keys  # nothing a recipe sets is dropped on the way
    transform = BatchTransform(mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26), size=32, augmentation=recipe)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    evaluated = transform(images)
    trained = transform.train()(images)
    assert trained.shape == (64, 3, 32, 32) and trained.dtype == torch.float32 and torch.isfinite(trained).all()
    core = recipe.get("crop_padding") or recipe.get("horizontal_flip")
    assert torch.equal(trained, evaluated) == (not set_keys and not core), name


def test_augmentation_ops_reads_missing_null_false_and_zero_as_off():
    # Bad values are the schema's to report (tests/unit/config/test_config.py); here only what is on.
    assert augmentation_ops(None) == {} and augmentation_ops(preset("none")) == {}
    off = {
        "name": "strong",
        "crop_padding": 0,
        "horizontal_flip": None,
        "color_jitter": {"brightness": 0.0, "contrast": None},
        "affine": {"degrees": 0, "scale": [1, 1]},
        "random_order": True,
    }
    assert augmentation_ops(OmegaConf.create(off)) == {}
    assert augmentation_ops(preset("shift")) == {}  # the core's shift alone
    strong = augmentation_ops(preset("strong"))
    assert strong["affine"] == {"degrees": 15.0, "translate": 0.1, "scale": (0.9, 1.1), "shear": 10.0}
    assert strong["color_jitter"] == {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4}


def test_an_all_off_config_leaves_training_batches_unchanged():
    images = asymmetric_images(8)
    off = {"name": "strong", "color_jitter": {"brightness": 0}, "affine": {"scale": [1.0, 1.0]}, "random_order": True}
    torch.testing.assert_close(identity_transform(8, off)(images), images, rtol=0, atol=0)


def test_random_erasing_zeroes_one_rectangle_in_about_its_share_of_samples():
    torch.manual_seed(0)
    images = torch.full((400, 3, 16, 16), 200, dtype=torch.uint8)
    transform = BatchTransform(
        mean=(0.0,), std=(1.0,), size=16, augmentation={"random_erasing": 0.5, "_checks_": CHECKS}, train=True
    )
    out = transform(images)
    erased = out == 0
    hit = erased.flatten(1).any(dim=1)
    assert 0.4 < hit.float().mean() < 0.6 and out.dtype == torch.float32
    for sample in erased[hit][:20]:
        rows, cols = sample[0].any(dim=1).nonzero().flatten(), sample[0].any(dim=0).nonzero().flatten()
        rectangle = sample[:, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert rectangle.all() and sample.sum() == rectangle.numel()  # one solid box, every channel
    torch.manual_seed(0)
    assert torch.equal(transform(images), out)  # the same seed, the same boxes
    assert not torch.equal(transform(images), out)  # the next draw (or another rank's seed): others
