"""The CIFAR-10 speed-run recipe (experiment=cifar10_speedrun) end to end; flip TTA itself: tests/unit/tasks/
test_tta_flip.py. Both the speedrun and the downloads rows list this file, so it goes with either."""

import os

import torch
import torch.nn.functional as F

from helpers import record_run, write_cifar
from trainkit.models.speedrun_net import SpeedrunNet


def test_the_speedrun_experiment_trains_on_cifar10_format_files(tmp_path, monkeypatch):
    """The recipe's pieces reach the loop: SpeedrunNet trains on channels_last batches with a
    label-smoothed loss and a warmup, and every evaluation batch is seen with its mirror (tta_flip)."""
    import torchvision.datasets.cifar as cifar

    # torchvision checks the real files' md5 sums; the fake files pass if they exist.
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    write_cifar(tmp_path / "data", per_batch=20, num_test=15)  # 90 train, 10 val, 15 test
    (tmp_path / "run").mkdir()
    overrides = [
        "experiment=cifar10_speedrun",
        f"data.root={tmp_path / 'data'}",
        "device=cpu",
        "precision=fp32",  # bf16 autocast on CPU works, but slowly
        "data.batch_size=32",
        "model.widths=[16,32,32]",  # the recipe's layout, narrower: seconds on a CPU
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "print_config=false",
    ]
    recording = record_run(tmp_path / "run", monkeypatch, *overrides)
    assert isinstance(recording.run.model, SpeedrunNet)
    assert recording.summary["epochs"] == 2 and recording.summary["steps"] == 4
    for forward in recording.training_forwards():
        assert forward.inputs.is_contiguous(memory_format=torch.channels_last) and not forward.inputs.is_contiguous()
    for outputs, targets, loss in recording.losses:
        torch.testing.assert_close(loss, F.cross_entropy(outputs, targets, label_smoothing=0.1))
    lrs = [group_lrs[0] for group_lrs in recording.lrs]
    assert lrs[0] < lrs[1]  # warming up
    evaluation = recording.eval_forwards()
    assert len(evaluation) == 2 * 3  # val twice (one batch), test once (one batch): each with its mirror
    for plain, mirrored in zip(evaluation[::2], evaluation[1::2], strict=True):
        assert torch.equal(mirrored.inputs, plain.inputs.flip(-1))
