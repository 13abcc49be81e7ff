"""Geometric augmentation of segmentation batches that moves each image and its mask together.

    images, masks = augment_image_and_mask(images, masks, horizontal_flip=True, crop_padding=0.125)

images [B, C, H, W] float, masks [B, H, W] int64, on any device; returns tensors of the same shapes and dtypes and never
changes the inputs (with both ops off, it returns the inputs). Per sample, drawn from torch's global RNG on the batch's
device, with no Python loop over samples:
- shift: pad by round(crop_padding * H) pixels (at least 1 when crop_padding > 0), then crop back at a random offset, as
  trainkit.augment.batch_transform.random_translate (an exact integer shift per axis);
- horizontal flip: mirror a random half of the samples.
What the shift brings in from outside is zeros in the image and `mask_fill` in the mask: 0, the background, by default;
pass the loss's ignore_index instead to keep those pixels out of the loss and the metrics.

Why one tensor: the mask rides along as one more channel of the image, so the same gather and the same flip move both,
and they cannot drift apart by a pixel. The channel is float32 (float64 for float64 images) and moved by indexing only,
never interpolated, so class values come back exact (float32 holds every integer below 2 ** 24). Photometric ops (colour
jitter) need no mask: apply them to the images alone; an affine warp interpolates and would blend classes, so it is not
offered here.
"""

import torch
from torch import Tensor

from trainkit.augment.batch_transform import random_translate


def augment_image_and_mask(
    images: Tensor, masks: Tensor, horizontal_flip: bool, crop_padding: float, mask_fill: int = 0
) -> tuple[Tensor, Tensor]:
    """See the module docstring."""
    if images.dim() != 4 or masks.shape != (images.shape[0], *images.shape[2:]):
        raise ValueError(
            f"need images [B, C, H, W] and masks [B, H, W], got {list(images.shape)} and {list(masks.shape)}"
        )
    padding = max(1, round(crop_padding * images.shape[-2])) if crop_padding > 0 else 0
    if not padding and not horizontal_flip:
        return images, masks
    # Shifted so that mask_fill becomes 0, the value random_translate pads with.
    mask_channel = (masks - mask_fill).unsqueeze(1)
    dtype = torch.promote_types(images.dtype, torch.float32)  # half precision would round large classes
    together = torch.cat([images.to(dtype), mask_channel.to(dtype)], dim=1)
    if padding:
        together = random_translate(together, padding)
    if horizontal_flip:
        flip = torch.rand(together.shape[0], device=together.device) < 0.5
        together = torch.where(flip.view(-1, 1, 1, 1), together.flip(-1), together)
    moved_images = together[:, :-1].to(images.dtype)
    moved_masks = together[:, -1].round().to(masks.dtype) + mask_fill
    return moved_images, moved_masks
