"""The CIFAR-10 speed-run recipe: SpeedrunNet, flip test-time augmentation, and the experiment end to end."""

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from helpers import write_cifar
from trainkit.data import TensorLoader
from trainkit.models.speedrun_net import SpeedrunNet
from trainkit.tasks import evaluate
from trainkit.tasks.classification import Classification

CLASSIFICATION = Classification(num_classes=10)  # evaluate's task: cross-entropy and accuracy


def test_speedrun_net_has_about_two_million_parameters_and_takes_small_inputs():
    model = SpeedrunNet(in_channels=3, num_classes=10)
    assert 1.5e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert SpeedrunNet(in_channels=1, num_classes=10, widths=(8, 16))(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_flip_tta_averages_the_logits_of_each_image_and_its_mirror():
    torch.manual_seed(0)
    images, labels = torch.rand(10, 1, 4, 4), torch.randint(0, 3, (10,))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))  # not mirror-symmetric
    loader = TensorLoader(images, labels, 4, shuffle=False)

    def evaluate_with(tta_flip: bool) -> dict:
        return evaluate(model, loader, lambda x: x, CLASSIFICATION, "fp32", torch.device("cpu"), tta_flip=tta_flip)

    with torch.no_grad():
        averaged = (model(images) + model(images.flip(-1))) / 2
    with_tta, without = evaluate_with(tta_flip=True), evaluate_with(tta_flip=False)
    assert with_tta["samples"] == 10
    assert math.isclose(with_tta["loss"], F.cross_entropy(averaged, labels).item(), rel_tol=1e-5)
    assert with_tta["acc"] == (averaged.argmax(1) == labels).sum().item() / 10
    assert not math.isclose(with_tta["loss"], without["loss"], rel_tol=1e-5)  # the mirror counted


# torchvision checks the real files' md5 sums; the fake files pass if they exist.
PATCHED_TRAIN = (
    "import os, runpy, sys, torchvision.datasets.cifar as cifar; "
    "cifar.check_integrity = lambda path, md5=None: os.path.isfile(path); "
    "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__')"
)


@pytest.mark.slow  # trains in a subprocess
def test_the_speedrun_experiment_trains_on_cifar10_format_files(tmp_path):
    write_cifar(tmp_path / "data", per_batch=20, num_test=15)  # 90 train, 10 val, 15 test
    run_dir = tmp_path / "run"
    overrides = [
        f"hydra.run.dir={run_dir}",
        "experiment=cifar10_speedrun",
        f"data.root={tmp_path / 'data'}",
        "precision=fp32",  # bf16 autocast on CPU works, but slowly
        "data.batch_size=32",
        "model.widths=[16,32,32]",  # the recipe's layout, narrower: seconds on a CPU
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "print_config=false",
    ]
    command = [sys.executable, "-c", PATCHED_TRAIN, *overrides]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-4000:]
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    for line in (
        "_target_: trainkit.models.speedrun_net.SpeedrunNet",
        "tta_flip: true",
        "channels_last: true",
        "horizontal_flip: true",
        "label_smoothing: 0.1",
        "warmup_epochs: 1",
    ):
        assert line in config, line
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["steps"] == 4
    assert math.isfinite(summary["test"]["test/loss"]) and 0 <= summary["test"]["test/acc"] <= 1
    weights = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert weights["features.1.residual.0.weight"].shape == (16, 16, 3, 3)
    assert weights["head.3.weight"].shape == (10, 32)
