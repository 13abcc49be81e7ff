"""Per-sample torchvision recipes for image folders (trainkit.augment.sample_transforms)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from helpers import needs_image_folders
from trainkit.augment.sample_transforms import SampleTransform, attach_sample_transform
from trainkit.data import build_data
from trainkit.data.loaders import TensorLoader
from trainkit.errors import ConfigError

AUGMENTATION = Path(__file__).resolve().parents[3] / "conf" / "augmentation"
CPU = torch.device("cpu")


def per_sample(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(AUGMENTATION / f"{name}.yaml"))["per_sample"]


def photo(mode: str) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).convert(mode)


@pytest.mark.parametrize("name", ["randaugment", "trivialaugment"])
@pytest.mark.parametrize(("mode", "channels"), [("L", 1), ("RGB", 3)])
def test_recipes_give_uint8_images_of_the_configured_size_and_channels(name, mode, channels):
    transform = SampleTransform(per_sample(name), 16)
    out = transform(photo(mode))
    assert out.shape == (channels, 16, 16) and out.dtype == torch.uint8


def test_draws_repeat_under_a_seed_and_differ_between_seeds():
    transform = SampleTransform(per_sample("randaugment"), 16)

    def draw(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)  # workers: seeded by the DataLoader from seed + rank
        return torch.stack([transform(photo("RGB")) for _ in range(4)])

    assert torch.equal(draw(0), draw(0)) and not torch.equal(draw(0), draw(1))


def test_without_a_crop_the_image_is_resized_and_centre_cropped_first():
    flip_only = SampleTransform({"horizontal_flip": True}, 16)
    outs = {tuple(flip_only(photo("RGB")).flatten()[:8].tolist()) for _ in range(12)}
    assert len(outs) == 2  # the centre crop, mirrored or not


@needs_image_folders
def test_attached_to_an_image_folder_loader_it_runs_in_the_workers(tmp_path):
    """A flip-only recipe: each training image, decoded in a worker, is its file's plain decode or
    that mirrored, and some are mirrored; evaluation is never augmented."""
    for index in range(8):
        folder = tmp_path / "train" / "ab"[index % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(index).integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
            folder / f"{index}.png"
        )
    cfg = OmegaConf.load(AUGMENTATION.parent / "data" / "imagefolder.yaml")
    cfg.merge_with({"root": str(tmp_path), "image_size": 12, "num_workers": 1, "batch_size": 4})
    plain = drain_images(build_data(cfg, CPU, seed=0).train)
    data = build_data(cfg, CPU, seed=0)
    attach_sample_transform(data.train, {"per_sample": {"horizontal_flip": True}})
    flipped = drain_images(data.train) + drain_images(data.train)  # two epochs: more draws
    decodes = {image.numpy().tobytes() for image in plain}
    mirrors = {image.flip(-1).numpy().tobytes() for image in plain}
    assert all(image.numpy().tobytes() in decodes | mirrors for image in flipped)
    assert any(image.numpy().tobytes() in mirrors - decodes for image in flipped)
    assert data.val.loader.dataset.transform is None  # evaluation is never augmented


def drain_images(loader) -> list[torch.Tensor]:
    return [image for images, _ in loader for image in images]


def test_in_memory_data_refuses_per_sample_recipes():
    loader = TensorLoader(torch.zeros(4, 1, 8, 8), torch.zeros(4), 2, shuffle=True)
    attach_sample_transform(loader, {"per_sample": None, "crop_padding": 0.1})  # nothing per sample: fine
    with pytest.raises(ConfigError) as error:
        attach_sample_transform(loader, OmegaConf.load(AUGMENTATION / "randaugment.yaml"))
    assert error.value.key == "augmentation.per_sample"
