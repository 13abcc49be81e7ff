"""Helpers that tests in several folders share (conftest holds the fixtures)."""

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cfg_for(metric="val/acc", **sweep):
    return OmegaConf.create(
        {"optimized_metric": metric, "sweep": {"catch_failures": True, "failed_trial_value": None, **sweep}}
    )


def final_weights(run) -> dict:
    return torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_same_training(resumed, straight):
    """The same last epoch (every val/ metric of the task, the LR, the step), test metrics and weights."""
    last = straight.epoch_metrics()[-1]
    keys = [key for key in last if key.startswith("val/")] + ["lr", "step"]
    assert len(keys) >= 4, keys  # val/loss and the task's metrics at least
    for key in keys:
        assert resumed.epoch_metrics()[-1][key] == pytest.approx(last[key], rel=1e-6), key
    assert resumed.summary["test"] == pytest.approx(straight.summary["test"], rel=1e-6)
    straight_weights, resumed_weights = final_weights(straight), final_weights(resumed)
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7)


def write_cifar(root: Path, per_batch: int, num_test: int) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(start: int, count: int) -> dict:
        # Rows are 1,024 red, 1,024 green, 1,024 blue bytes: red = sample number, green 1, blue 2.
        numbers = np.arange(start, start + count)
        planes = np.stack([np.full((count, 1024), fill) for fill in (0, 1, 2)], axis=1)
        planes[:, 0] = numbers[:, None]
        return {"data": planes.reshape(count, 3072).astype(np.uint8), "labels": (numbers % 10).tolist()}

    for index in range(5):
        (folder / f"data_batch_{index + 1}").write_bytes(pickle.dumps(batch(index * per_batch, per_batch)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(0, num_test)))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
