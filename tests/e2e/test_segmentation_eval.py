"""eval.py on a segmentation run (experiment=shapes_segmentation), judged by what it writes: the run's test metrics
again, tested with flip TTA (a setting a re-evaluation easily gets wrong), and a mask for each predicted image."""

from pathlib import Path

import numpy as np
import pytest
from test_eval import Evaluation, save_image, train

from conftest import ROOT, TrainRun, composed
from helpers import needs_predict, nothing_left, template_has
from trainkit.checkpointing import save_checkpoint
from trainkit.config import to_dict
from trainkit.models import build_model

SEGMENTATION = (
    "experiment=shapes_segmentation",
    "data.num_samples=192",
    "data.val_samples=48",
    "data.test_samples=64",
    "data.image_size=16",
    "data.batch_size=16",
    "model.widths=[8,16]",
    "trainer.max_epochs=2",
    # shapes mirror into shapes: the mean of each image's and its mirror's class maps (where tta_flip is kept)
    *["trainer.tta_flip=true"] * template_has("trainer.tta_flip"),
)

FIGURES = ROOT / "src" / "trainkit" / "tracking" / "evaluation_figures.py"  # the eval_figures row's


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory) -> TrainRun:
    return train(tmp_path_factory.mktemp("segmentation") / "run", *SEGMENTATION)


@pytest.mark.slow  # trains (once for the module)
def test_segmentation_eval_equals_the_summary(segmentation, tmp_path):
    metrics = Evaluation(tmp_path / "out", f"checkpoint={segmentation.run_dir}").metrics
    test = segmentation.summary["test"]
    assert set(test) == {"test/loss", "test/miou", "test/pixel_acc"}
    assert {key: metrics[key] for key in test} == test and metrics["samples"] == 64


@needs_predict
@pytest.mark.slow  # trains (once for the module)
def test_segmentation_predict_writes_a_mask_per_image(segmentation, tmp_path):
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        pixels = np.zeros((20, 16), np.uint8)  # not square: resized to 16 x 16, its mask back to 16 wide, 20 high
        pixels[4 + i : 12, 2:10] = 255
        Image.fromarray(pixels, mode="L").save(folder / f"box{i}.png")
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={segmentation.run_dir}", f"predict={folder}")
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    masks = sorted((tmp_path / "out" / "masks").iterdir())
    assert [path.name for path in masks] == ["box0.png", "box1.png", "box2.png"]
    for path in masks:
        mask = np.array(Image.open(path))
        assert mask.shape == (20, 16) and mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1, 2, 3}
    assert not (tmp_path / "out" / "predictions.csv").exists()


@pytest.fixture(scope="module")
def untrained_segmentation_run(tmp_path_factory) -> Path:
    """A run directory with checkpoints/last.pt of a small experiment=shapes_segmentation config, untrained."""
    run_dir = tmp_path_factory.mktemp("untrained_segmentation") / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    config = to_dict(composed("experiment=shapes_segmentation", "data.image_size=16", "model.widths=[8,16]"))
    model = build_model(config["model"])
    state = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 20}
    save_checkpoint(run_dir / "checkpoints" / "last.pt", {**state, "batches_done": 0, "config": config})
    return run_dir


@needs_predict
def test_predicted_masks_of_images_named_alike_are_all_written(untrained_segmentation_run, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.png", "a.PNG", "a.jpg", "b.png"):
        save_image(folder / name, 16, 16)
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_segmentation_run}", f"predict={folder}")
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    assert "predictions for 4 images" in evaluation.stdout
    written = sorted(path.name for path in (tmp_path / "out" / "masks").iterdir())
    assert written == ["a.PNG.png", "a.jpg.png", "a.png.png", "b.png"]  # b's name is its own: kept as it was


@needs_predict
def test_a_mask_is_written_at_its_images_size(untrained_segmentation_run, tmp_path):
    from PIL import Image

    (tmp_path / "images").mkdir()
    save_image(tmp_path / "images" / "wide.png", 64, 48)  # not the 16 x 16 the model reads
    evaluation = Evaluation(
        tmp_path / "out", f"checkpoint={untrained_segmentation_run}", f"predict={tmp_path / 'images'}"
    )
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    mask = np.array(Image.open(tmp_path / "out" / "masks" / "wide.png"))
    assert mask.shape == (48, 64) and mask.dtype == np.uint8


def test_a_model_other_than_the_runs_own_is_refused_in_one_line(untrained_segmentation_run, tmp_path):
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_segmentation_run}", "model=cnn")
    assert evaluation.returncode == 1
    lines = evaluation.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model: "), evaluation.stderr
    assert nothing_left(tmp_path / "out")  # a failed call leaves no output directory behind


@pytest.mark.slow  # trains (once for the module)
@pytest.mark.skipif(not FIGURES.is_file(), reason="trimmed: no eval_figures")
def test_segmentation_eval_draws_the_masks(segmentation, tmp_path):
    from matplotlib.image import imread

    assert Evaluation(tmp_path / "out", f"checkpoint={segmentation.run_dir}").returncode == 0
    picture = imread(tmp_path / "out" / "predictions.png")
    assert picture[..., :3].reshape(-1, 3).std(axis=0).max() > 0.05
    assert not (tmp_path / "out" / "confusion_matrix.png").exists()
