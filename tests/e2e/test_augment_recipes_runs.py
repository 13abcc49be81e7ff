"""augmentation=mixup and the per-image recipes reach the loop: short in-process runs of train.py's `train()`,
watched from inside as tests/e2e/test_wiring.py watches the core's options (CONTRIBUTING.md's "Wiring")."""

import torch
from test_wiring import SHORT_RUN  # a narrow CNN, three batches of 8 digits: a run takes about a second

from helpers import record_run


def test_mixup_and_cutmix_mix_the_batch_the_model_trains_on(tmp_path, monkeypatch):
    """The loss gets soft targets (two labels' shares a sample), and the model gets mixed images,
    not the transformed batch."""
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "augmentation=mixup", "augmentation.crop_padding=null")
    for (_, transformed), forward, (_, targets, _) in zip(
        recording.transformed, recording.training_forwards(), recording.losses, strict=True
    ):
        assert targets.shape == (8, 10) and targets.dtype == torch.float32
        torch.testing.assert_close(targets.sum(dim=1), torch.ones(8))
        assert (targets.max(dim=1).values < 1).any()  # mixed with a sample of another label
        assert not torch.equal(forward.inputs, transformed)


def test_per_sample_transforms_of_an_image_folder_reach_the_training_batches(tmp_path, monkeypatch):
    """A flip-only per-sample recipe (decoded in the loader, here without workers): every training image
    is a file's plain decode or its mirror, and some are mirrored."""
    from PIL import Image

    from trainkit.data.image_files import decode

    files = []
    for index in range(24):
        folder = tmp_path / "images" / "train" / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = torch.randint(0, 256, (8, 8, 3), generator=torch.Generator().manual_seed(index), dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"{index}.png")
        files.append(folder / f"{index}.png")
    plain = {decode(str(path), "RGB", 8).numpy().tobytes() for path in files}
    mirrored = {decode(str(path), "RGB", 8).flip(-1).numpy().tobytes() for path in files}
    flips_only = ("augmentation.per_sample.random_resized_crop=null", "augmentation.per_sample.policy=null")
    image_folder = ("data=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8", "data.num_workers=0")
    (tmp_path / "run").mkdir()  # the run directory, beside the image folder
    recording = record_run(
        tmp_path / "run",
        monkeypatch,
        *SHORT_RUN,
        *image_folder,
        "augmentation=trivialaugment",
        *flips_only,
        "augmentation.random_erasing=null",
    )
    seen = [image.numpy().tobytes() for images, _ in recording.transformed for image in images]
    assert len(seen) >= 16 and all(image in plain | mirrored for image in seen)
    assert any(image in mirrored - plain for image in seen)
