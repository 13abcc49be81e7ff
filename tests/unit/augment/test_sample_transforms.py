"""Per-sample torchvision recipes for image folders (trainkit.augment.sample_transforms)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

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


def test_attached_to_an_image_folder_loader_it_runs_in_the_workers(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "train" / name).mkdir(parents=True)
        for index in range(4):
            photo("RGB").save(tmp_path / "train" / name / f"{index}.png")
    cfg = OmegaConf.load(AUGMENTATION.parent / "data" / "imagefolder.yaml")
    cfg.merge_with({"root": str(tmp_path), "image_size": 12, "num_workers": 1, "batch_size": 4})
    data = build_data(cfg, CPU, seed=0)
    attach_sample_transform(data.train, OmegaConf.load(AUGMENTATION / "trivialaugment.yaml"))
    assert isinstance(data.train.loader.dataset.transform, SampleTransform)
    images, _ = next(iter(data.train))
    assert images.shape == (4, 3, 12, 12) and images.dtype == torch.uint8
    assert data.val.loader.dataset.transform is None  # evaluation is never augmented


def test_in_memory_data_refuses_per_sample_recipes():
    loader = TensorLoader(torch.zeros(4, 1, 8, 8), torch.zeros(4), 2, shuffle=True)
    attach_sample_transform(loader, {"per_sample": None, "crop_padding": 0.1})  # nothing per sample: fine
    with pytest.raises(ConfigError) as error:
        attach_sample_transform(loader, OmegaConf.load(AUGMENTATION / "randaugment.yaml"))
    assert error.value.key == "augmentation.per_sample"
