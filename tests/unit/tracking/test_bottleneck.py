"""trainkit.tracking.bottleneck: the epoch line's extras, the data-bound warning with its advice, and the loader
rules it applies (a third of the compute time; the next worker count: the cores, then 1.5x, at most 2x)."""

import logging
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset

from helpers import needs_file_data, needs_image_folders, template_has
from trainkit.data.loaders import TensorLoader
from trainkit.tracking import bottleneck
from trainkit.tracking.bottleneck import (
    data_bound,
    data_bound_advice,
    epoch_line_extras,
    loading_per_compute,
    more_workers,
    warn_if_data_bound,
    worker_advice,
)
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


class Files:
    """Batches of SlowImages as a file loader yields them, and its torch DataLoader as `loader`: what the report
    reads of a loader of files (trainkit.data.file_data.FileLoader's)."""

    def __init__(self, workers: int):
        self.loader = DataLoader(SlowImages(), batch_size=2, num_workers=workers)

    def __iter__(self):
        return iter(self.loader)


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


@needs_image_folders
def test_a_slow_dataset_fires_the_warning_once_a_run_with_advice_for_files(caplog):
    data = OmegaConf.load(CONF / "imagefolder.yaml")
    data.root = "/data/images"
    loader = Files(workers=0)
    timer = LoopTimer()
    with caplog.at_level(logging.WARNING, logger="train"):
        for _ in range(2):  # two epochs: one warning
            metrics = train_epoch(timer, loader)
            assert metrics["train/data_wait_fraction"] > 1 / 4
            warn_if_data_bound(timer, metrics, loader, data)
    (warning,) = warnings_of(caplog)
    assert "data=imagefolder" in warning and "rule of thumb: at most a third of the compute time" in warning
    cache = ("scripts/preprocess.py", "data=cached") if template_has("data/cached.yaml") else ()
    for switch in ("data.num_workers=", "data.image_size (now 224)", *cache):
        assert switch in warning, switch
    assert "pin_memory" not in warning  # training on the CPU: pinning does not apply
    on_cuda = "\n".join(data_bound_advice(loader, data, on_cuda=True))
    assert "data.pin_memory=true" in on_cuda


@needs_file_data
def test_file_data_that_is_not_images_gets_no_image_advice():
    """Signals (a text folder, a data kind of yours) read from files: workers apply, image sizes and the image cache
    do not; the advice read data.image_size, which such data lacks, and the data-bound run ended in a traceback."""
    data = OmegaConf.create({"_target_": "file_data_for_tests.DigitSignals", "name": "signals", "batch_size": 2})
    advice = "\n".join(data_bound_advice(Files(workers=0), data, on_cuda=False))
    assert "data.num_workers=" in advice
    assert "image_size" not in advice and "preprocess.py" not in advice


@needs_image_folders
@pytest.mark.parametrize("fraction, warns", [(0.25, False), (0.26, True)])
def test_the_warning_fires_above_a_third_of_the_compute_time(fraction, warns, caplog):
    """A wait of 0.25 of the step is a third of the compute (0.25 / 0.75): on the line, no warning."""
    data = OmegaConf.load(CONF / "imagefolder.yaml")
    data.root = "/data/images"
    timer = LoopTimer()
    timer.start_epoch(CPU)
    metrics = {"train/data_wait_fraction": fraction, "train/step_ms": 10.0}
    with caplog.at_level(logging.WARNING, logger="train"):
        warn_if_data_bound(timer, metrics, Files(workers=0), data)
    assert len(warnings_of(caplog)) == warns
    if warns:
        assert warnings_of(caplog)[0].startswith(
            "data-bound: loading took 35% of the compute time (the step waited for its batch 26% of the time)"
        )


@pytest.mark.parametrize(
    "workers, cores, on_cuda, gpu_util, names",
    [
        (2, 8, False, None, "data.num_workers=8 (now 2; the articles start at the cores: 8)"),
        (2, 8, True, 0.3, "data.num_workers=8 (now 2; the articles start at the cores: 8)"),
        (8, 8, True, 0.4, "data.num_workers=12 (now 8, 1.5x; the GPU was busy 40% of the time, under 50%)"),
        (8, 8, True, None, "data.num_workers=12 (now 8, 1.5x; loading is too slow)"),  # no pynvml: no gpu_util
        (12, 8, True, 0.4, "data.num_workers=16 (now 12, not 1.5x (18): 2x the cores (8) is the most"),
        (16, 8, True, 0.4, "the 16 workers are 2x the cores (8) or more"),
        (8, 8, False, None, "the 8 workers are as many as the cores (8) or more, and training on the CPU"),
    ],
)
def test_the_worker_advice_goes_to_the_cores_then_1_5x_and_never_above_2x(workers, cores, on_cuda, gpu_util, names):
    assert names in worker_advice(workers, cores, on_cuda, gpu_util)


@needs_image_folders
def test_the_advice_reads_the_cores_of_this_rank_and_the_gpu_util(monkeypatch):
    monkeypatch.setattr(bottleneck, "this_rank_cores", lambda: 1)  # one worker: torch warns above the machine's cores
    data = OmegaConf.load(CONF / "imagefolder.yaml")
    data.root = "/data/images"
    loader = Files(workers=1)
    (workers, *_) = data_bound_advice(loader, data, on_cuda=True, gpu_util=0.45)
    assert workers.startswith("more decoding workers: data.num_workers=2 (now 1, 1.5x; the GPU was busy 45%")


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
    assert metrics["train/data_wait_fraction"] < 1 / 4 and warnings_of(caplog) == []
    (advice,) = data_bound_advice(loader, data, on_cuda=True)
    assert "data.batch_size (now 64)" in advice and "num_workers=" not in advice and "pin_memory=" not in advice


def test_the_epoch_line_extras_are_compact():
    assert epoch_line_extras({"train/data_wait_fraction": 0.123, "train/step_ms": 3.14, "train/cpu_util": 0.85}) == (
        "  data 12% of 3.1 ms/step  cpu 85%"
    )
    cuda = {"train/data_wait_fraction": 0.4, "train/step_ms": 9.8, "train/gpu_util": 0.55, "train/peak_memory_gb": 12.3}
    assert epoch_line_extras(cuda) == "  data 40% of 9.8 ms/step  gpu 55%  mem 12.3 GiB"
    assert epoch_line_extras({}) == ""
    profiled = {"train/data_wait_fraction": 0.05, "train/step_ms": 80.0, "train/profiled_steps": 7}
    assert epoch_line_extras(profiled) == "  data 5% of 80.0 ms/step (the epoch, 7 of its steps under the profiler)"


@pytest.mark.parametrize(
    "workers, cores, expected",
    [
        (2, 8, 8),  # below the cores: the articles' start first
        (0, 1, 1),
        (8, 8, 12),  # at the cores: 1.5x (the articles: 8 -> 12)
        (32, 32, 48),
        (3, 3, 5),  # 4.5, rounded up
        (12, 8, 16),  # 1.5x would be 18: held at 2x the cores
        (16, 8, None),  # 2x the cores: the ceiling
        (40, 8, None),  # set above it by hand: no more
    ],
)
def test_more_workers_steps_to_the_cores_then_1_5x_never_above_2x(workers, cores, expected):
    assert more_workers(workers, cores) == expected


def test_the_data_bound_line_is_a_third_of_the_compute_time():
    """wait / (step - wait) > 1/3: a wait of 0.25 of the step is exactly a third of the compute."""
    assert loading_per_compute(0.25) == pytest.approx(1 / 3)
    assert not data_bound(0.25) and data_bound(0.26)
    assert not data_bound(0.0) and data_bound(1.0)
