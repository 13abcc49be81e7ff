"""Image files: an image opened as Pillow reads it, resized and centre-cropped to uint8 (image folders decode
theirs in the DataLoader workers, eval.py's predict= reads its images so), and arrays written as PNG files
(`save_png`: predicted maps, the trackers' sample grids). Pillow is imported only where images are opened or
written. `python scripts/trim.py --drop image_files` removes this module with what needs it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from PIL import Image

# Named in messages; any extension Pillow can open is read.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


def decode(path: str, mode: str, size: int) -> torch.Tensor:
    """The image at `path` in `mode`, resized and centre-cropped to `size`; raises what Pillow raises."""
    return resize_center_crop(open_image(path, mode, size), size)


def open_image(path: str, mode: str, size: int) -> Image.Image:
    """The fully decoded image in `mode` ("L" or "RGB"), alpha dropped. Pillow's own convert would clip 16-bit
    values to 255 and warn about palette transparency."""
    from PIL import Image

    with Image.open(path) as image:
        image.draft(mode, (size, size))  # JPEG only: decode at a reduced scale still >= size, much faster
        image.load()  # a truncated or corrupt file fails here, inside the caller's try
        if image.mode == "I" or image.mode.startswith("I;16"):
            # 16-bit greyscale (PNG/TIFF; "I" is how Pillow may open it): keep the top 8 bits.
            pixels = np.asarray(image, dtype=np.float64) / 256
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")
        elif image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")
        return image.convert(mode)


def resize_center_crop(image: Image.Image, size: int) -> torch.Tensor:
    """Resize the shorter side to `size`, centre-crop `size x size`: uint8 [C, size, size]."""
    from PIL import Image

    scale = size / min(image.size)
    width, height = (max(size, round(side * scale)) for side in image.size)
    image = image.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    pixels = np.array(image.crop((left, top, left + size, top + size)))  # a writable copy for torch
    if pixels.ndim == 2:
        return torch.from_numpy(pixels).unsqueeze(0)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


@cache
def image_extensions() -> frozenset[str]:
    """Every file extension Pillow can open here (lower case), e.g. .png, .jpg, .webp, .ppm, .tga."""
    from PIL import Image

    return frozenset(ext.lower() for ext, kind in Image.registered_extensions().items() if kind in Image.OPEN)


def save_png(array: np.ndarray, path: str | Path) -> Path:
    """Write a uint8 array [H, W, 3] (or [H, W]) as a PNG, creating its folder; returns the path."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(array, dtype=np.uint8)).save(path)
    return path
