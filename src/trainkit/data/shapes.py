"""Shapes: a segmentation data set drawn from a seed: images [N, 3, S, S] in [0, 1], masks [N, S, S] with
0 for the background, 1 circle, 2 square, 3 triangle. The keys: conf/data/shapes.yaml.

The shapes' colours are random and differ from the background by at least MIN_CONTRAST in every channel, and the
three shapes have the same area for the same size, so a pixel's class shows only in the outline around it. Split i
(train 0, val 1, test 2) is drawn from its own generator seeded with 3 * split_seed + i, so changing one split's
size changes no other split.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from trainkit.config.schema import Check, integer, number
from trainkit.data.datasets import ImageData, Split, Splits

SHAPE_NAMES = ("circle", "square", "triangle")  # mask values 1, 2, 3
NUM_CLASSES = len(SHAPE_NAMES) + 1
MIN_CONTRAST = 0.3
TEXTURE_GRID = 4
# In units of the square root of the area, so that the three shapes have equal areas.
CIRCLE_RADIUS = 1 / math.sqrt(math.pi)
SQUARE_HALF_SIDE = 0.5
TRIANGLE_INRADIUS = 1 / math.sqrt(3 * math.sqrt(3))
# The farthest point of any shape from its centre (a triangle's corner).
REACH = 2 * TRIANGLE_INRADIUS


@dataclass(kw_only=True)
class Shapes(ImageData):
    """The `data=shapes` option: train, val and test splits of (images, masks)."""

    num_samples: int
    val_samples: int
    test_samples: int
    noise: float
    split_seed: int
    max_shapes: int = 3
    shape_size: Sequence[float] = (0.2, 0.4)
    texture: float = 0.1

    uses_root: ClassVar[bool] = False
    suits: ClassVar[tuple[str, ...]] = ("task=segmentation", "model=unet", "model=torchvision_segmentation")
    config_rules: ClassVar[dict[str, Check]] = {
        "num_samples": integer(1),
        "val_samples": integer(1),
        "test_samples": integer(1),
        "noise": number(0),
    }

    def splits(self) -> Splits:
        shape_size = tuple(float(v) for v in self.shape_size)
        counts = (self.num_samples, self.val_samples, self.test_samples)
        train, val, test = (
            draw_shapes(
                count,
                seed=3 * self.split_seed + index,
                image_size=self.image_size,
                noise=float(self.noise),
                max_shapes=self.max_shapes,
                shape_size=shape_size,
                texture=float(self.texture),
            )
            for index, count in enumerate(counts)
        )
        return Splits(train, val, test, num_classes=NUM_CLASSES)


def draw_shapes(
    count: int,
    seed: int,
    image_size: int = 64,
    noise: float = 0.05,
    max_shapes: int = 3,
    shape_size: tuple[float, ...] = (0.2, 0.4),
    texture: float = 0.1,
) -> Split:
    """`count` images and their masks, a pure function of the arguments."""
    min_size, max_size = shape_size
    if not 0 < min_size <= max_size <= 1 / (2 * REACH):
        raise ValueError(f"shape_size must satisfy 0 < min <= max <= {1 / (2 * REACH):.3f} (to fit), got {shape_size}")
    if not (count >= 0 and image_size >= 1 and 1 <= max_shapes <= 255):  # 255: the uint8 `owner` below
        raise ValueError(
            f"need count >= 0, image_size >= 1, 1 <= max_shapes <= 255; got {count}, {image_size}, {max_shapes}"
        )
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
        return low + (high - low) * torch.rand(*shape, generator=generator)

    # Every random number is drawn first, in a fixed order.
    base_colour = uniform(count, 3)
    blotches = torch.randn(count * 3, TEXTURE_GRID, TEXTURE_GRID, generator=generator)
    shapes_in_image = torch.randint(1, max_shapes + 1, (count,), generator=generator)
    classes = torch.randint(1, NUM_CLASSES, (max_shapes, count), generator=generator)
    sizes = uniform(max_shapes, count, low=min_size, high=max_size)
    # Centres keep a shape wholly inside the image: REACH * size from every border.
    margins = REACH * sizes.unsqueeze(-1)
    centres = margins + (1 - 2 * margins) * uniform(max_shapes, count, 2)
    angles = uniform(max_shapes, count, high=2 * math.pi)
    # 0.3..0.7 from the base colour, wrapping around 1, keeps every channel at least MIN_CONTRAST away.
    colours = (base_colour + uniform(max_shapes, count, 3, low=MIN_CONTRAST, high=1 - MIN_CONTRAST)) % 1
    images = torch.randn(count, 3, image_size, image_size, generator=generator).mul_(noise)

    # The last shape drawn over a pixel owns it, so later shapes cover earlier ones.
    pixel_centres = (torch.arange(image_size, dtype=torch.float32) + 0.5) / image_size
    owner = torch.zeros(count, image_size, image_size, dtype=torch.uint8)
    for slot in range(max_shapes):
        left, right = _row_spans(pixel_centres, centres[slot], sizes[slot], angles[slot], classes[slot])
        columns = pixel_centres.view(1, 1, -1)
        inside = (columns >= left.unsqueeze(-1)) & (columns <= right.unsqueeze(-1))
        inside &= (slot < shapes_in_image).view(count, 1, 1)
        owner.masked_fill_(inside, slot + 1)
    owner_index = owner.view(count, 1, image_size * image_size).long()
    class_table = torch.cat([torch.zeros(count, 1, dtype=torch.int64), classes.T], dim=1)  # [N, 1 + slots]
    masks = class_table.gather(1, owner_index[:, 0]).view(count, image_size, image_size)
    colour_table = torch.cat([base_colour.unsqueeze(0), colours]).permute(1, 2, 0)  # [N, 3, 1 + slots]
    images += colour_table.gather(2, owner_index.expand(-1, 3, -1)).view_as(images)
    # The blotches cover shapes and background alike, like uneven light, so the local contrast stays.
    upsample = _linear_upsampling(TEXTURE_GRID, image_size)  # [S, G]
    images += (upsample @ (texture * blotches) @ upsample.T).view_as(images)
    return images.clamp_(0, 1), masks


def _row_spans(rows: Tensor, centres: Tensor, sizes: Tensor, angles: Tensor, classes: Tensor) -> tuple[Tensor, Tensor]:
    """[N, S] x-coordinates `left` and `right`: where each pixel row crosses each image's shape.

    A convex shape meets a row in one interval (left > right where it misses it), which keeps the geometry in
    [N, S] tensors. A polygon's edge with outward unit normal (nx, ny) at distance `apothem` from the centre bounds
    x - cx by (apothem - ny * (y - cy)) / nx.
    """
    dy = rows.view(1, -1) - centres[:, 1:2]  # [N, S]
    size, angle, centre_x = sizes.view(-1, 1), angles.view(-1, 1), centres[:, 0:1]
    squared = (CIRCLE_RADIUS * size).square() - dy.square()
    half_chord = torch.where(squared >= 0, squared.clamp(min=0).sqrt(), torch.full_like(squared, -1.0))
    spans = {1: (-half_chord, half_chord)}
    for shape_class, corners, apothem in ((2, 4, SQUARE_HALF_SIDE), (3, 3, TRIANGLE_INRADIUS)):
        left, right = torch.full_like(dy, -math.inf), torch.full_like(dy, math.inf)
        for corner in range(corners):
            normal_angle = angle + 2 * math.pi * corner / corners
            normal_x, normal_y = normal_angle.cos(), normal_angle.sin()
            # The nudge avoids a division by zero should nx ever be exactly 0.
            normal_x = torch.where(normal_x >= 0, normal_x.clamp(min=1e-6), normal_x.clamp(max=-1e-6))
            bound = (apothem * size - normal_y * dy) / normal_x
            right = torch.where(normal_x > 0, torch.minimum(right, bound), right)
            left = torch.where(normal_x < 0, torch.maximum(left, bound), left)
        spans[shape_class] = (left, right)
    image_class = classes.view(-1, 1)
    left, right = (
        torch.where(image_class == 1, spans[1][i], torch.where(image_class == 2, spans[2][i], spans[3][i]))
        for i in (0, 1)
    )
    return centre_x + left, centre_x + right


def _linear_upsampling(grid: int, size: int) -> Tensor:
    """[size, grid] weights of linear interpolation: applied to rows, then columns, a bilinear resize."""
    identity = torch.eye(grid).unsqueeze(1)  # [grid, 1, grid]: each row one grid point's impulse
    return F.interpolate(identity, size=size, mode="linear", align_corners=False).squeeze(1).T
