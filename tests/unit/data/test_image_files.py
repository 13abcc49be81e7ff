"""trainkit.data.image_files: image files decoded as Pillow reads them, resized and centre-cropped."""

import numpy as np
import torch
from PIL import Image

from trainkit.data.image_files import decode


def test_decode_resizes_the_shorter_side_and_centre_crops(tmp_path):
    # 20 x 10 (width x height): left half black, right half white -> 16 x 8 -> centre 8 x 8.
    pixels = np.zeros((10, 20), dtype=np.uint8)
    pixels[:, 10:] = 255
    Image.fromarray(pixels).save(tmp_path / "halves.PNG")
    image = decode(str(tmp_path / "halves.PNG"), "L", 8)
    assert image.shape == (1, 8, 8) and image.dtype == torch.uint8
    assert (image[0, :, :3] == 0).all() and (image[0, :, 5:] == 255).all()
    Image.fromarray(pixels).convert("RGB").save(tmp_path / "halves.JPG")
    assert decode(str(tmp_path / "halves.JPG"), "RGB", 8).shape == (3, 8, 8)
