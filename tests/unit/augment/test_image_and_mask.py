"""Segmentation augmentation: image and mask move together, by exact shifts and flips, per sample."""

import pytest
import torch

from trainkit.augment.image_and_mask import augment_image_and_mask


def coded_batch(batch: int = 32, size: int = 16, classes: int = 4, seed: int = 0):
    """Random masks, and images whose channel 0 is the mask's class and channel 1 a code unique
    to each pixel (so where every output pixel came from can be read back)."""
    generator = torch.Generator().manual_seed(seed)
    masks = torch.randint(0, classes, (batch, size, size), generator=generator)
    position = (torch.arange(size * size).view(size, size) + 1).float() / (size * size)
    images = torch.stack([masks.float() / (classes - 1), position.expand(batch, -1, -1)], dim=1)
    return images, masks


def shifted(x: torch.Tensor, dy: int, dx: int, fill: float) -> torch.Tensor:
    """x [..., H, W] moved down by dy and right by dx, `fill` coming in."""
    height, width = x.shape[-2:]
    out = torch.full_like(x, fill)
    out[..., max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = x[
        ..., max(-dy, 0) : height + min(-dy, 0), max(-dx, 0) : width + min(-dx, 0)
    ]
    return out


def test_the_mask_still_matches_the_image_pixel_for_pixel():
    torch.manual_seed(0)
    images, masks = coded_batch()
    new_images, new_masks = augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.25)
    assert new_masks.dtype == torch.int64 and new_images.dtype == torch.float32
    assert set(new_masks.unique().tolist()) <= {0, 1, 2, 3}
    # Padding is zeros in the image and 0 (background) in the mask: the code still holds there.
    assert torch.equal((new_images[:, 0] * 3).round().long(), new_masks)


def test_every_sample_is_an_exact_shift_of_its_own_possibly_flipped_self():
    torch.manual_seed(1)
    images, masks = coded_batch()
    padding = 4  # 0.25 of 16
    new_images, new_masks = augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.25)
    moves = []
    for image, mask, new_image, new_mask in zip(images, masks, new_images, new_masks):
        found = [
            (flip, dy, dx)
            for flip in (False, True)
            for dy in range(-padding, padding + 1)
            for dx in range(-padding, padding + 1)
            if torch.equal(shifted(image.flip(-1) if flip else image, dy, dx, 0.0), new_image)
        ]
        assert len(found) == 1  # the position code makes the move unique
        flip, dy, dx = found[0]
        assert torch.equal(shifted(mask.flip(-1) if flip else mask, dy, dx, 0), new_mask)
        moves.append(found[0])
    flips = [flip for flip, _, _ in moves]
    assert any(flips) and not all(flips)  # per sample: some flipped, some not
    assert len({(dy, dx) for _, dy, dx in moves}) > 5  # per-sample offsets


def test_padding_can_be_marked_with_an_ignore_index():
    torch.manual_seed(2)
    images, masks = coded_batch()
    new_images, new_masks = augment_image_and_mask(
        images, masks, horizontal_flip=False, crop_padding=0.25, mask_fill=255
    )
    came_from_outside = new_images[:, 1] == 0  # every real pixel has a code above 0
    assert came_from_outside.any()
    assert (new_masks[came_from_outside] == 255).all()
    assert torch.equal((new_images[:, 0] * 3).round().long()[~came_from_outside], new_masks[~came_from_outside])


def test_off_changes_nothing_and_the_inputs_are_never_changed():
    images, masks = coded_batch()
    before = images.clone(), masks.clone()
    same_images, same_masks = augment_image_and_mask(images, masks, horizontal_flip=False, crop_padding=0.0)
    assert torch.equal(same_images, images) and torch.equal(same_masks, masks)
    augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.25)
    assert torch.equal(images, before[0]) and torch.equal(masks, before[1])


def test_the_draws_come_from_the_global_rng():
    images, masks = coded_batch()
    torch.manual_seed(3)
    first = augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.25)
    torch.manual_seed(3)
    second = augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.25)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_half_precision_images_keep_large_class_values_exact():
    images, masks = coded_batch(batch=8)
    masks = masks * 1000  # classes up to 3000: float16 would round 3001 and beyond
    new_images, new_masks = augment_image_and_mask(images.half(), masks + 1, horizontal_flip=True, crop_padding=0.25)
    assert new_images.dtype == torch.float16
    assert set(new_masks.unique().tolist()) <= {0, 1, 1001, 2001, 3001}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_everything_stays_there_and_still_matches():
    images, masks = coded_batch()
    new_images, new_masks = augment_image_and_mask(images.cuda(), masks.cuda(), horizontal_flip=True, crop_padding=0.25)
    assert new_images.is_cuda and new_masks.is_cuda
    assert torch.equal((new_images[:, 0] * 3).round().long(), new_masks)
