"""eval.py's pictures (trainkit.tracking.evaluation_figures) end to end: the confusion matrix of a classification
run and the same from two DDP processes (a segmentation run's masks: test_segmentation_eval.py). The runs are
test_eval.py's fixtures, trained again for this module."""

import json

import numpy as np
import pytest
import test_eval
import torch
from test_eval import Evaluation

from conftest import composed
from trainkit.data import make_data

# test_eval.py's runs, as fixtures of this module too (their scope is a module: trained again here)
classification = test_eval.classification
classification_eval = test_eval.classification_eval


@pytest.mark.slow  # trains (once for the module)
def test_the_confusion_matrix_counts_every_test_sample_once(classification_eval):
    from matplotlib.image import imread

    metrics, out_dir = classification_eval.metrics, classification_eval.out_dir
    picture = imread(out_dir / "confusion_matrix.png")
    assert picture.ndim == 3 and picture.shape[0] > 200 and picture.shape[1] > 200
    assert picture[..., :3].reshape(-1, 3).std(axis=0).max() > 0.05  # a figure, not a blank
    confusion = json.loads((out_dir / "confusion_matrix.json").read_text())
    counts = np.array(confusion["counts"])
    assert confusion["classes"] == [str(label) for label in range(10)] and counts.shape == (10, 10)
    assert counts.sum() == metrics["samples"] == 359
    test_labels = make_data(composed().data).splits().test[1]
    assert counts.sum(axis=1).tolist() == torch.bincount(test_labels, minlength=10).tolist()  # rows: true classes
    assert counts.trace() / counts.sum() == pytest.approx(metrics["test/acc"], abs=1e-12)


@pytest.mark.slow
def test_two_ddp_processes_draw_the_same_confusion_matrix(classification_eval, classification, tmp_path):
    Evaluation(
        tmp_path / "ddp", f"checkpoint={classification.run_dir}", "distributed=ddp", "distributed.nproc_per_node=2"
    )
    assert (tmp_path / "ddp" / "confusion_matrix.json").read_text() == (
        classification_eval.out_dir / "confusion_matrix.json"
    ).read_text()
    written = sorted(path.name for path in (tmp_path / "ddp").iterdir() if path.is_file())
    assert written == ["confusion_matrix.json", "confusion_matrix.png", "eval.log", "metrics.json"]
