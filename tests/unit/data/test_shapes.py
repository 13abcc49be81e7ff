"""The shapes data: a pure function of its config, masks and images in range, the mask matching the image."""

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from trainkit.data.shapes import NUM_CLASSES, Shapes, draw_shapes

CONF = Path(__file__).resolve().parents[3] / "conf"


def shapes_config(**changes):
    """conf/data/shapes.yaml, small: its keys are Shapes' fields."""
    config = OmegaConf.to_container(OmegaConf.load(CONF / "data" / "shapes.yaml"))
    small = {"num_samples": 12, "val_samples": 6, "test_samples": 6, "image_size": 32, "split_seed": 0, "noise": 0.05}
    return {key: value for key, value in {**config, **small, **changes}.items() if key != "_target_"}


def make_shapes(config: dict):
    return Shapes(**config).splits()


def test_the_same_config_gives_the_same_data():
    first, second = make_shapes(shapes_config()), make_shapes(shapes_config())
    for split in ("train", "val", "test"):
        assert all(torch.equal(a, b) for a, b in zip(getattr(first, split), getattr(second, split)))


def test_seeds_and_splits_differ():
    splits = make_shapes(shapes_config())
    other_seed = make_shapes(shapes_config(split_seed=1))
    assert not torch.equal(splits.train[0], other_seed.train[0])
    assert not torch.equal(splits.val[0], splits.test[0])
    assert not torch.equal(splits.train[0][:6], splits.val[0])
    # Seeds 3 * split_seed + split: seed 1's train is not seed 0's val, nor any other pair.
    assert not torch.equal(other_seed.train[0][:6], splits.val[0])


def test_a_split_does_not_depend_on_the_size_of_the_others():
    small, large = make_shapes(shapes_config()), make_shapes(shapes_config(num_samples=40, val_samples=2))
    assert torch.equal(small.test[0], large.test[0]) and torch.equal(small.test[1], large.test[1])


def test_images_and_masks_have_the_promised_shapes_types_and_ranges():
    splits = make_shapes(shapes_config(num_samples=64))
    images, masks = splits.train
    assert splits.num_classes == NUM_CLASSES == 4
    assert images.shape == (64, 3, 32, 32) and images.dtype == torch.float32
    assert masks.shape == (64, 32, 32) and masks.dtype == torch.int64
    assert images.min() >= 0 and images.max() <= 1
    assert set(masks.unique().tolist()) == {0, 1, 2, 3}  # every class occurs in 64 images
    assert (masks > 0).flatten(1).any(dim=1).all()  # every image shows at least one shape


def test_the_yaml_builds_it_and_the_optional_keys_take_draw_shapes_defaults():
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "data" / "shapes.yaml"), shapes_config())
    assert torch.equal(instantiate(cfg).splits().train[1], make_shapes(shapes_config()).train[1])
    optional = ("max_shapes", "shape_size", "texture")
    without = {key: value for key, value in shapes_config().items() if key not in optional}
    assert torch.equal(make_shapes(without).train[0], make_shapes(shapes_config()).train[0])  # 3, (0.2, 0.4), 0.1


def test_without_noise_and_texture_the_image_is_the_mask_painted():
    # Background pixels all have the background colour; shape pixels differ from it in every
    # channel by at least 0.3 (up to float rounding), and pixels of one shape share one colour.
    images, masks = draw_shapes(32, seed=5, image_size=32, noise=0.0, texture=0.0)
    for image, mask in zip(images, masks):
        background = image[:, mask == 0]
        assert background.numel() and (background == background[:, :1]).all()
        shapes = image[:, mask > 0]
        assert ((shapes - background[:, :1]).abs() >= 0.3 - 1e-6).all()
        assert len(shapes.T.unique(dim=0)) <= 3  # at most max_shapes colours


def test_the_three_shapes_cover_the_same_area_for_the_same_size():
    # One shape an image, all of the same size: the areas differ only by pixel rounding.
    _, masks = draw_shapes(300, seed=0, image_size=64, noise=0.0, max_shapes=1, shape_size=(0.4, 0.4))
    area = 0.4**2 * 64**2
    for shape_class in (1, 2, 3):
        pixels = (masks == shape_class).flatten(1).sum(dim=1)
        pixels = pixels[pixels > 0].float()
        assert len(pixels) > 50 and abs(pixels.mean().item() / area - 1) < 0.03


def test_a_shape_size_that_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="shape_size"):
        draw_shapes(1, seed=0, shape_size=(0.3, 0.9))


def test_an_empty_split_has_the_right_shapes():
    images, masks = make_shapes(shapes_config(val_samples=0)).val
    assert images.shape == (0, 3, 32, 32) and masks.shape == (0, 32, 32)
