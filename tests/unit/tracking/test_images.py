"""Image grids: torchvision's make_grid does the tiling, imported only when a grid is made.
(More grid tests, with W&B logging, are in test_wandb.py.)"""

import subprocess
import sys

import numpy as np
import torch

from trainkit.tracking.images import image_grid


def test_a_single_image_keeps_its_frame():
    grid = image_grid(torch.full((1, 1, 3, 2), 1.0), border=2)  # make_grid alone returns it unframed
    assert grid.shape == (3 + 4, 2 + 4, 3)
    assert (grid[2:5, 2:4] == 255).all()
    frame = np.ones(grid.shape[:2], bool)
    frame[2:5, 2:4] = False
    assert (grid[frame] == 128).all()


def test_a_grid_matches_make_grid_tiling():
    from torchvision.utils import make_grid

    images = torch.rand(10, 3, 4, 5)
    expected = (make_grid(images, nrow=4, padding=1, pad_value=128 / 255) * 255).round().to(torch.uint8)
    assert np.array_equal(image_grid(images, columns=4), expected.permute(1, 2, 0).numpy())


def test_importing_images_does_not_import_torchvision():
    code = "import sys, trainkit.tracking.images; print('torchvision' in sys.modules)"
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert process.stdout.strip() == "False", process.stderr[-2000:]
