"""trainkit.tracking.timing: waiting for data vs the rest of the step, and the utilization measures."""

import time

import pytest
import torch

from trainkit.tracking import timing
from trainkit.tracking.timing import LoopTimer

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def timed_epoch(timer: LoopTimer, steps: int, wait_s: float, step_s: float, device: torch.device = CPU) -> dict:
    """The loop train.py runs, with a loader that takes `wait_s` a batch and a step that takes `step_s`."""
    timer.start_epoch(device)
    for _ in range(steps):
        time.sleep(wait_s)  # blocked in the loader's __next__
        timer.batch_ready()
        time.sleep(step_s)
        timer.step_done()
    return timer.epoch_metrics()


def test_a_slow_loader_shows_as_waiting_and_a_slow_step_does_not():
    timer = LoopTimer()
    slow_data = timed_epoch(timer, 4, wait_s=0.03, step_s=0.0)
    assert slow_data["train/data_wait_fraction"] > 0.8 and slow_data["train/step_ms"] >= 3 * 30 / 4  # not the first
    slow_step = timed_epoch(timer, 4, wait_s=0.0, step_s=0.03)  # the sums start again each epoch
    assert slow_step["train/data_wait_fraction"] < 0.2 and slow_step["train/step_ms"] >= 30
    assert "train/gpu_util" not in slow_step and "train/peak_memory_gb" not in slow_step


def test_cpu_util_is_the_process_cpu_time_over_wall_time_and_cores(monkeypatch):
    """A clock under the test's control: 3 s of CPU time in 4 s of wall time on 2 cores is 0.375."""
    clock = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(timing.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(timing, "available_cores", lambda: 2)
    timer = LoopTimer()
    timer.start_epoch(CPU)
    clock["wall"] += 5  # waiting for the first batch (start-up): left out, as its CPU time
    clock["cpu"] += 5
    timer.batch_ready()
    clock["wall"] += 4
    clock["cpu"] += 3
    timer.step_done()
    assert timer.epoch_metrics()["train/cpu_util"] == 3 / 4 / 2


def test_the_compile_step_is_left_out():
    timer = LoopTimer()
    timer.start_epoch(CPU, skip_first=True)
    time.sleep(0.2)  # compile + first step: a long wait that is not the loader's fault
    timer.batch_ready()
    timer.step_done()
    for _ in range(3):
        timer.batch_ready()
        time.sleep(0.01)
        timer.step_done()
    metrics = timer.epoch_metrics()
    assert metrics["train/data_wait_fraction"] < 0.2 and metrics["train/step_ms"] < 100


def test_the_first_batch_of_an_epoch_is_start_up_not_waiting():
    timer = LoopTimer()
    timer.start_epoch(CPU)
    time.sleep(0.2)  # DataLoader workers starting
    for _ in range(3):
        timer.batch_ready()
        time.sleep(0.01)
        timer.step_done()
    assert timer.epoch_metrics()["train/data_wait_fraction"] < 0.2


def test_an_epoch_without_steps_reports_no_step_time():
    timer = LoopTimer()
    timer.start_epoch(CPU)
    assert set(timer.epoch_metrics()) == {"train/cpu_util"}


class FakeEvent:
    """A CUDA event on a GPU whose clock is the host's; while `gpu_behind`, no event has finished."""

    gpu_behind = False

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return not FakeEvent.gpu_behind

    def synchronize(self) -> None:
        FakeEvent.gpu_behind = False

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1000


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA branch of LoopTimer on this CPU machine: events, peak memory and NVML faked."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(timing, "GPU_UTIL_EVERY_SECONDS", 0.0)
    return monkeypatch


def test_cuda_events_are_summed_as_they_finish(fake_cuda):
    fake_cuda.setattr(timing, "can_read_gpu_util", lambda: True)
    fake_cuda.setattr(torch.cuda, "utilization", lambda device=None: 50)
    timer = LoopTimer()
    metrics = timed_epoch(timer, 4, wait_s=0.02, step_s=0.0, device=CUDA)
    assert metrics["train/data_wait_fraction"] > 0.8 and metrics["train/step_ms"] >= 3 * 20 / 4
    assert metrics["train/peak_memory_gb"] == 3 and metrics["train/gpu_util"] == 0.5
    assert len(timer.events) == 1  # finished events are folded in; the last step's end starts the next
    assert "train/cpu_util" not in metrics

    FakeEvent.gpu_behind = True  # the host runs ahead: nothing is summed until the epoch's end waits once
    timer.start_epoch(CUDA)
    for _ in range(3):
        time.sleep(0.02)
        timer.batch_ready()
        timer.step_done()
    assert len(timer.events) == 1 + 2 * 3 and timer.waiting == timer.stepping == 0  # ready(0) twice: no first wait
    metrics = timer.epoch_metrics()
    assert not FakeEvent.gpu_behind and len(timer.events) == 1
    assert metrics["train/data_wait_fraction"] > 0.8 and metrics["train/step_ms"] >= 2 * 20 / 3


def test_without_nvml_gpu_util_is_left_out_without_an_error(fake_cuda):
    fake_cuda.setattr(timing, "can_read_gpu_util", lambda: False)
    metrics = timed_epoch(LoopTimer(), 2, wait_s=0.0, step_s=0.0, device=CUDA)
    assert "train/gpu_util" not in metrics and "train/peak_memory_gb" in metrics

    def no_driver(device=None):
        raise RuntimeError("NVML: driver not loaded")

    fake_cuda.setattr(timing, "can_read_gpu_util", lambda: True)
    fake_cuda.setattr(torch.cuda, "utilization", no_driver)
    metrics = timed_epoch(LoopTimer(), 2, wait_s=0.0, step_s=0.0, device=CUDA)
    assert "train/gpu_util" not in metrics and "train/data_wait_fraction" in metrics
