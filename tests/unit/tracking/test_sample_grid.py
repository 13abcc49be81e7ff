"""logger.log_images, the grid of augmented training samples: checked beside its code and off without a tracker;
torchvision's make_grid does the tiling, imported only when a grid is made; the grid unnormalizes, clamps and frames;
save_png; the augmented samples leave training's randomness alone."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import composed
from helpers import assert_one_config_error
from trainkit.data.image_files import save_png
from trainkit.tracking.sample_grid import image_grid


def test_log_images_is_checked_beside_its_code_and_off_without_a_tracker():
    assert_one_config_error(["logger.log_images=yes"], "logger.log_images")
    assert composed().logger.log_images is False  # logger=none: no tracker to show the grid, no work


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
    code = "import sys, trainkit.tracking.sample_grid; print('torchvision' in sys.modules)"
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert process.stdout.strip() == "False", process.stderr[-2000:]


def test_image_grid_unnormalizes_tiles_and_frames():
    mean, std = (0.5, 0.25, 0.0), (0.5, 0.25, 1.0)
    raw = torch.rand(10, 3, 4, 5)
    normalized = (raw - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    grid = image_grid(normalized, mean, std, columns=4)
    assert grid.dtype == np.uint8 and grid.shape == (3 * 5 + 1, 4 * 6 + 1, 3)
    expected = (raw.permute(0, 2, 3, 1) * 255).round().numpy()
    assert np.abs(grid[1:5, 1:6].astype(float) - expected[0]).max() <= 1  # first tile
    assert np.abs(grid[6:10, 7:12].astype(float) - expected[5]).max() <= 1  # row 1, column 1
    assert (grid[0] == 128).all() and (grid[:, 0] == 128).all() and (grid[5] == 128).all()
    assert (grid[11:15, 13:] == 128).all()  # the empty cells of the last row


def test_image_grid_clamps_and_repeats_grayscale():
    images = torch.tensor([[-5.0, 0.0], [0.5, 5.0]]).view(1, 1, 2, 2)
    grid = image_grid(images, mean=[0.0], std=[1.0], border=0)
    assert grid.shape == (2, 2, 3)
    assert grid[..., 0].tolist() == [[0, 0], [128, 255]] and (grid[..., 0] == grid[..., 2]).all()
    with pytest.raises(ValueError):
        image_grid(torch.zeros(2, 4, 3, 3))


def test_save_png_round_trips(tmp_path):
    from PIL import Image

    grid = image_grid(torch.rand(3, 1, 8, 8))
    path = save_png(grid, tmp_path / "images" / "grid.png")
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), grid)


def test_augmented_samples_enlarge_tiny_images_and_leave_training_randomness_alone():
    from trainkit.augment.batch_transform import BatchTransform
    from trainkit.data import TensorLoader
    from trainkit.tracking.sample_grid import augmented_samples

    loader = TensorLoader(torch.rand(40, 1, 8, 8), torch.zeros(40, dtype=torch.long), 16, shuffle=False)
    transform = BatchTransform((0.5,), (0.5,), 8, {"name": "shift", "crop_padding": 0.25}, train=True)
    torch.manual_seed(0)
    expected_next_draw = torch.rand(1)
    torch.manual_seed(0)
    grid = augmented_samples(loader, transform, (0.5,), (0.5,), torch.device("cpu"))
    assert torch.equal(torch.rand(1), expected_next_draw)  # the forked RNG left the stream untouched
    assert grid.shape == (2 * (32 + 1) + 1, 8 * (32 + 1) + 1, 3)  # 16 tiles of 8x8 shown at 32x32


def test_augmented_samples_show_what_the_task_shows_of_a_dict_batch_and_nothing_of_one_without_images():
    from tasks_for_tests import CaptionedClassification, SignalClassification
    from trainkit.augment.batch_transform import BatchTransform
    from trainkit.tracking.sample_grid import augmented_samples

    images, labels = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8), torch.zeros(40, dtype=torch.long)
    pairs = [(images, labels)]
    dicts = [{"image": images, "caption": torch.zeros(40, 20, dtype=torch.uint8), "targets": labels}]
    cpu = torch.device("cpu")

    def transform(entries=()):
        return BatchTransform((0.5,), (0.5,), 8, {"name": "shift", "crop_padding": 0.25}, train=True, entries=entries)

    torch.manual_seed(0)
    of_pairs = augmented_samples(pairs, transform(), (0.5,), (0.5,), cpu)
    torch.manual_seed(0)  # the same draws: the dict's image entry alone is augmented, as the pair's inputs
    of_dicts = augmented_samples(dicts, transform(("image",)), (0.5,), (0.5,), cpu, task=CaptionedClassification(10))
    assert of_dicts is not None and np.array_equal(of_dicts, of_pairs)
    signals = [{"signal": torch.rand(40, 9), "lengths": torch.full((40,), 9), "label": labels}]
    assert augmented_samples(signals, torch.nn.Identity(), None, None, cpu, task=SignalClassification(10)) is None
