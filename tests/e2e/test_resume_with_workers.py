"""What an image folder's per-image augmentation draws in the DataLoader workers follows from (seed, epoch, the
sample's index) (trainkit.data.file_data.SeededSamples): the same run trains the same weights with 0, 1 or 2 workers,
and one stopped by SIGTERM inside an epoch and resumed, with another number of workers too, ends as it would have."""

import os

import pytest
import torch

from conftest import ROOT
from helpers import needs_image_folders, template_has

# The random per-image draws in the workers are augment_recipes' (docs/features.md): a trimmed clone has none.
pytestmark = pytest.mark.skipif(not template_has("augmentation/trivialaugment.yaml"), reason="trimmed: no recipes")

# 48 images of 12x12 pixels, a class a colour; val and test carved a quarter each: 3 training batches of 8 an epoch.
RUN = (
    "data.image_size=8",
    "data.batch_size=8",
    "data.val_fraction=0.25",
    "data.test_fraction=0.25",
    "augmentation=trivialaugment",  # a random crop, flip and TrivialAugment per image, in the workers
    "model._target_=models_for_tests.PreemptedCNN",
    "model.widths=[8,8,8]",
    "trainer.max_epochs=2",
    "trainer.progress_bar=false",
    "print_config=false",
    "regularization.early_stopping.enabled=false",
)


@pytest.fixture
def images(tmp_path):
    from PIL import Image

    root, generator = tmp_path / "images", torch.Generator().manual_seed(0)
    for label, colour in enumerate(("red", "green", "blue")):
        (root / "train" / colour).mkdir(parents=True)
        for i in range(16):
            pixels = torch.randint(0, 40, (12, 12, 3), generator=generator, dtype=torch.uint8)
            pixels[..., label] += 200
            Image.fromarray(pixels.numpy()).save(root / "train" / colour / f"{i}.png")
    return ("data=imagefolder", f"data.root={root}", *RUN)


def last_tensors(run) -> dict[str, torch.Tensor]:
    """Every tensor of last.pt's model and optimizer state, by its path."""
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    found = {}

    def collect(value, path):
        if isinstance(value, torch.Tensor):
            found[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                collect(item, f"{path}.{key}")
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                collect(item, f"{path}.{index}")

    collect(checkpoint["model"], "model")
    collect(checkpoint["optimizer"], "optimizer")
    return found


def assert_same_tensors(run, other) -> None:
    tensors, others = last_tensors(run), last_tensors(other)
    assert tensors.keys() == others.keys() and len(tensors) > 20
    assert [path for path in tensors if not torch.equal(tensors[path], others[path])] == []


@needs_image_folders
@pytest.mark.slow  # five runs, two in subprocesses (a SIGTERM)
def test_per_image_augmentation_trains_the_same_with_any_workers_and_after_a_resume(run_train, images, monkeypatch):
    runs = {workers: run_train(*images, f"data.num_workers={workers}") for workers in (0, 1, 2)}
    assert runs[0].summary["test"] == runs[1].summary["test"] == runs[2].summary["test"]
    assert_same_tensors(runs[0], runs[1])
    assert_same_tensors(runs[0], runs[2])

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    # SIGTERM in the 5th update, the 2nd batch of epoch 1: one worker had read ahead of the stop.
    stopped = run_train(*images, "data.num_workers=1", "+model.preempt_at=5", isolated=True, check=False)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    resumed = run_train("resume=auto", *images, "data.num_workers=2", "+model.preempt_at=0", run_dir=stopped.run_dir,
                        isolated=True)  # fmt: skip
    assert "at epoch 1, batch 2, step 5" in resumed.stdout + resumed.stderr
    assert resumed.summary["test"] == runs[1].summary["test"]
    assert_same_tensors(resumed, runs[1])
