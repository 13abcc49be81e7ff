"""BatchTransform: conversion, resize, normalization, its shift and flip, and the augmenting module a feature builds
for it."""

import sys
import types

import pytest
import torch
from torch import nn

from trainkit.augment.batch_transform import BatchTransform

SHIFT = {"name": "shift", "crop_padding": 0.125}  # conf/augmentation/shift.yaml


def asymmetric_images(batch: int, size: int = 8) -> torch.Tensor:
    """Random images in (0, 1]: no zeros (so padding is recognizable) and no mirror symmetry."""
    torch.manual_seed(123)
    return torch.rand(batch, 1, size, size) * 0.9 + 0.1


def shifted(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """`image` [C, H, W] moved down by dy and right by dx, zeros entering."""
    out = torch.zeros_like(image)
    h, w = image.shape[-2:]
    out[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        :, max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
    ]
    return out


def matching_shift(output: torch.Tensor, image: torch.Tensor, padding: int):
    for dy in range(-padding, padding + 1):
        for dx in range(-padding, padding + 1):
            if torch.equal(output, shifted(image, dy, dx)):
                return dy, dx
    return None


def test_uint8_and_float_inputs_give_the_same_normalized_float32_batch():
    transform = BatchTransform(mean=(0.3,), std=(0.37,), size=8, augmentation=None, train=False)
    images = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8)
    from_uint8, from_float = transform(images), transform(images.float() / 255)
    assert from_uint8.dtype == torch.float32 and from_uint8.shape == (16, 1, 8, 8)
    torch.testing.assert_close(from_uint8, from_float)
    torch.testing.assert_close(from_uint8, (images.float() / 255 - 0.3) / 0.37)


def test_per_channel_statistics_and_normalization():
    transform = BatchTransform(mean=(0.1, 0.5, 0.9), std=(0.5, 0.25, 0.1), size=4)
    images = torch.full((2, 3, 4, 4), 0.5)
    out = transform(images)
    torch.testing.assert_close(out[:, 0], torch.full((2, 4, 4), 0.8))
    torch.testing.assert_close(out[:, 1], torch.zeros(2, 4, 4))
    torch.testing.assert_close(out[:, 2], torch.full((2, 4, 4), -4.0))
    # Standardizing with the batch's own statistics gives mean 0, std 1.
    images = torch.rand(64, 1, 8, 8)
    out = BatchTransform(mean=(images.mean().item(),), std=(images.std().item(),), size=8)(images)
    assert abs(out.mean().item()) < 1e-5 and abs(out.std().item() - 1) < 1e-4


def test_resize_from_8_to_32():
    transform = BatchTransform(mean=(0.5,), std=(0.5,), size=32, augmentation=SHIFT, train=True)
    assert transform(torch.full((4, 1, 8, 8), 255, dtype=torch.uint8)).shape == (4, 1, 32, 32)
    eval_out = BatchTransform(mean=(0.5,), std=(0.5,), size=32)(torch.full((4, 1, 8, 8), 255, dtype=torch.uint8))
    torch.testing.assert_close(eval_out, torch.ones(4, 1, 32, 32))  # a constant image stays constant
    assert BatchTransform(mean=(0.5,), std=(0.5,), size=8)(torch.rand(2, 1, 32, 32)).shape == (2, 1, 8, 8)


def test_a_dict_batch_is_transformed_in_the_entries_its_data_names_and_refused_in_one_line_where_none_are():
    from trainkit.data.datasets import Digits, ImageData
    from trainkit.errors import ConfigError

    images = torch.randint(0, 256, (6, 1, 8, 8), dtype=torch.uint8)
    caption, targets = torch.randint(0, 256, (6, 20), dtype=torch.uint8), torch.arange(6)
    keys = dict(name="digits", num_classes=10, batch_size=4, eval_batch_size=4, num_workers=0, drop_last=False)
    keys |= dict(shuffle=False, channels=1, image_size=8, mirror_changes_label=True, mean=[0.3], std=[0.4])
    keys |= dict(val_fraction=0.1, test_fraction=0.2, split_seed=0)

    class Captioned(Digits):
        image_entries = ("image",)

    transform = Captioned(**keys).batch_transform(None, None, False, train=False)
    transformed = transform({"image": images, "caption": caption, "targets": targets})
    assert torch.equal(transformed["image"], (images.float() / 255 - 0.3) / 0.4)  # as the pair's inputs would be
    assert transformed["caption"] is caption and transformed["targets"] is targets  # the others as they are
    assert ImageData.image_entries == ()  # pairs: their inputs
    unnamed = Digits(**keys).batch_transform(None, None, False, train=False)
    with pytest.raises(
        ConfigError, match=r"^data\._target_: makes dict batches \(keys image, caption\), .* names none"
    ):
        unnamed({"image": images, "caption": caption})
    with pytest.raises(ConfigError, match=r"names 'image', which the batch lacks; name the entries that hold images"):
        transform({"picture": images})


def test_the_module_a_checks_module_builds_augments_training_batches_between_resize_and_normalizing(monkeypatch):
    """The augmentation section's `_checks_` modules are asked for `on_device_augment`; what it builds sees the resized
    [0, 1] images of training batches only, and its output is what gets normalized."""
    seen = []

    class AddOne(nn.Module):
        def forward(self, x):
            seen.append(x.clone())
            return x + 1

    def on_device_augment(augmentation, size, mean):
        assert augmentation["strength"] == 3 and size == 4 and mean.shape == (1, 1, 1, 1)
        return AddOne()

    monkeypatch.setitem(sys.modules, "my_augment", types.SimpleNamespace(on_device_augment=on_device_augment))
    monkeypatch.setitem(sys.modules, "my_checks", types.SimpleNamespace())  # names no on_device_augment: skipped
    section = {"name": "mine", "_checks_": {"other": "my_checks", "mine": "my_augment"}, "strength": 3}
    transform = BatchTransform(mean=(0.5,), std=(0.25,), size=4, augmentation=section, train=True)
    images = torch.full((2, 1, 8, 8), 255, dtype=torch.uint8)
    torch.testing.assert_close(transform(images), torch.full((2, 1, 4, 4), (2.0 - 0.5) / 0.25))
    torch.testing.assert_close(seen[0], torch.ones(2, 1, 4, 4))  # resized and in [0, 1]
    torch.testing.assert_close(transform.eval()(images), torch.full((2, 1, 4, 4), 2.0))  # evaluation: not augmented
    assert len(seen) == 1
    assert (
        BatchTransform(mean=(0.5,), std=(0.25,), size=4, augmentation={"name": "none"}, train=True).feature_ops is None
    )


def test_shift_is_an_exact_integer_translation_per_sample_and_never_flips():
    images = asymmetric_images(256)
    out = BatchTransform(mean=(0.0,), std=(1.0,), size=8, augmentation=SHIFT, train=True)(
        images
    )  # 0.125 * 8 = 1 pixel of padding
    shifts = [matching_shift(out[i], images[i], padding=1) for i in range(len(images))]
    assert None not in shifts, "every output is its input shifted by whole pixels, unflipped"
    # One draw per sample: all nine shifts turn up in one batch (each with probability 1/9).
    assert len(set(shifts)) == 9


def test_flip_mirrors_about_half_of_the_samples_exactly():
    images = asymmetric_images(1000)
    out = BatchTransform(
        mean=(0.0,), std=(1.0,), size=8, augmentation={"name": "basic", "horizontal_flip": True}, train=True
    )(images)
    flipped = torch.tensor([torch.equal(o, i.flip(-1)) for o, i in zip(out, images)])
    kept = torch.tensor([torch.equal(o, i) for o, i in zip(out, images)])
    assert bool((flipped ^ kept).all()), "each sample is either untouched or an exact mirror"
    assert 0.4 < flipped.float().mean().item() < 0.6
