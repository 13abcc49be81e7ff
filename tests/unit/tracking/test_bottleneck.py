"""trainkit.tracking.bottleneck: the epoch line's extras and the data-bound warning, with its advice."""

import logging
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from trainkit.data.loaders import FileLoader, TensorLoader
from trainkit.tracking.bottleneck import data_bound_advice, epoch_line_extras, warn_if_data_bound
from trainkit.tracking.timing import LoopTimer

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"
CPU = torch.device("cpu")


class SlowImages(Dataset):
    """Images that take 10 ms each to 'decode': the loader, not the step, is the bottleneck."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.01)
        return torch.zeros(3, 4, 4, dtype=torch.uint8), index % 2


def train_epoch(timer: LoopTimer, loader) -> dict:
    """train.py's measuring points around a step that costs almost nothing."""
    timer.start_epoch(CPU)
    for images, labels in loader:
        images, labels = images.to(CPU, non_blocking=True), labels.to(CPU, non_blocking=True)
        timer.batch_ready()
        (images.float().mean() + labels.sum()).item()
        timer.step_done()
    return timer.epoch_metrics()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "data-bound" in r.getMessage()]


def test_a_slow_dataset_fires_the_warning_once_a_run_with_advice_for_files(caplog):
    data = OmegaConf.load(CONF / "imagefolder.yaml")
    data.root = "/data/images"
    loader = FileLoader(SlowImages(), 2, shuffle=False, num_workers=0)
    timer = LoopTimer()
    with caplog.at_level(logging.WARNING, logger="train"):
        for _ in range(2):  # two epochs: one warning
            metrics = train_epoch(timer, loader)
            assert metrics["train/data_wait_fraction"] > 1 / 3
            warn_if_data_bound(timer, metrics, loader, data)
    (warning,) = warnings_of(caplog)
    assert "data=imagefolder" in warning and "rule of thumb" in warning
    for switch in ("data.num_workers=", "data.image_size (now 224)", "scripts/preprocess.py", "data=cached"):
        assert switch in warning, switch
    assert "pin_memory" not in warning  # training on the CPU: pinning does not apply
    on_cuda = "\n".join(data_bound_advice(loader, data, on_cuda=True))
    assert "data.pin_memory=true" in on_cuda


def test_in_memory_data_stays_silent_and_its_advice_names_what_applies(caplog):
    data = OmegaConf.load(CONF / "digits.yaml")
    images, labels = torch.zeros(64, 1, 8, 8), torch.zeros(64, dtype=torch.int64)
    loader = TensorLoader(images, labels, 8, shuffle=True)
    timer = LoopTimer()
    timer.start_epoch(CPU)
    for _ in loader:
        timer.batch_ready()
        time.sleep(0.005)  # a step that takes the time: the data is never waited for
        timer.step_done()
    metrics = timer.epoch_metrics()
    with caplog.at_level(logging.WARNING, logger="train"):
        warn_if_data_bound(timer, metrics, loader, data)
    assert metrics["train/data_wait_fraction"] < 1 / 3 and warnings_of(caplog) == []
    (advice,) = data_bound_advice(loader, data, on_cuda=True)
    assert "data.batch_size (now 64)" in advice and "num_workers=" not in advice and "pin_memory=" not in advice


def test_the_epoch_line_extras_are_compact():
    assert epoch_line_extras({"train/data_wait_fraction": 0.123, "train/step_ms": 3.14, "train/cpu_util": 0.85}) == (
        "  data 12% of 3.1 ms/step  cpu 85%"
    )
    cuda = {"train/data_wait_fraction": 0.4, "train/step_ms": 9.8, "train/gpu_util": 0.55, "train/peak_memory_gb": 12.3}
    assert epoch_line_extras(cuda) == "  data 40% of 9.8 ms/step  gpu 55%  mem 12.3 GiB"
    assert epoch_line_extras({}) == ""
