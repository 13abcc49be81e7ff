"""debug=profile (trainkit.tracking.profiling): the window's trace and phase shares, the timer that drives it,
its line's advice, its config checks."""

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from test_timing import CPU, fake_cuda, timed_epoch  # noqa: F401 (fake_cuda: a fixture, used by name)

from helpers import config_check_tests
from trainkit.data.loaders import TensorLoader
from trainkit.tracking import profiling
from trainkit.tracking.bottleneck import data_bound_advice
from trainkit.tracking.profiling import PHASES, ProfiledTimer, StepProfiler, describe, phase_shares
from trainkit.tracking.timing import LoopTimer

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"


def profiler_config(**overrides):
    return {"enabled": True, "wait": 1, "warmup": 1, "active": 2, "row_limit": 5, **overrides}


def train_steps(profiler: StepProfiler, steps: int) -> None:
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        inputs = torch.randn(16, 8)
        profiler.phase("forward")
        loss = model(inputs).square().mean()
        profiler.phase("backward")
        loss.backward()
        profiler.phase("optimizer_step")
        optimizer.step()
        optimizer.zero_grad()
        profiler.phase("bookkeeping")
        profiler.step()


def test_off_it_profiles_nothing_and_writes_nothing(tmp_path):
    for profiler in (StepProfiler(), StepProfiler({**profiler_config(), "enabled": False}, tmp_path)):
        train_steps(profiler, 2)
        profiler.close()
        assert profiler.profile is None and profiler._label is None
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize("enabled, is_main", [(False, True), (True, False)])
def test_a_run_without_the_profiler_keeps_its_own_timer(enabled, is_main, tmp_path):
    """Off, or on a rank other than 0, the loop runs on the run's LoopTimer: no profiler code in its steps."""
    timer = LoopTimer()
    run = SimpleNamespace(
        cfg=OmegaConf.create({"profiler": profiler_config(enabled=enabled)}),
        proc=SimpleNamespace(is_main=is_main),
        timer=timer,
        run_dir=tmp_path,
        device=CPU,
    )
    assert profiling.profiled_timer(run) is timer  # type: ignore[arg-type]
    profiling.close_profiler(timer)  # nothing to close
    assert not (tmp_path / "profile").exists()


def test_the_window_gives_a_trace_the_top_operators_and_the_phase_shares(tmp_path):
    profiler = StepProfiler(profiler_config(row_limit=50), tmp_path, torch.device("cpu"))
    train_steps(profiler, 6)  # the window is steps 2-3; it stops by itself after them
    assert profiler.profile is None and profiler.written
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    labels = {event.get("name") for event in trace["traceEvents"]}
    assert set(PHASES) <= labels
    assert "aten::" in (tmp_path / "profile" / "top_ops.txt").read_text()
    shares = json.loads((tmp_path / "profile" / "phases.json").read_text())
    assert list(shares) == list(PHASES) and sum(shares.values()) == pytest.approx(1.0)


def test_a_run_shorter_than_the_window_says_so(tmp_path, caplog):
    profiler = StepProfiler(profiler_config(wait=5), tmp_path, torch.device("cpu"))
    train_steps(profiler, 2)
    with caplog.at_level(logging.WARNING, logger="trainkit.tracking.profiling"):
        profiler.close()
    assert "before the profiled window" in caplog.text and not (tmp_path / "profile" / "trace.json").exists()


def test_data_over_a_third_of_the_compute_names_the_loader_as_the_bottleneck():
    loader_bound = phase_shares({"data": 26.0, "forward": 34.0, "backward": 40.0})
    assert loader_bound["data"] == pytest.approx(0.26)
    assert "data loading is the bottleneck" in describe(loader_bound)
    on_the_line = phase_shares({"data": 25.0, "forward": 35.0, "backward": 40.0})  # 25 / 75: a third of the compute
    assert "compute-bound" in describe(on_the_line)


@pytest.mark.slow  # trains in this process (run_train)
def test_debug_profile_writes_a_trace_of_the_training_loop(run_train):
    run = run_train(
        "debug=profile",
        "profiler.wait=1",
        "profiler.warmup=1",
        "profiler.active=2",
        "trainer.limit_train_batches=5",
        "print_config=false",
    )
    trace = json.loads((run.run_dir / "profile" / "trace.json").read_text())  # valid JSON: Perfetto opens it
    assert set(PHASES) <= {event.get("name") for event in trace["traceEvents"]}
    assert "aten::" in (run.run_dir / "profile" / "top_ops.txt").read_text()
    assert "share of steps 2-3 under the profiler: data" in run.stdout
    assert run.summary["epochs"] == 1


def test_a_window_across_an_epoch_end_leaves_validation_out_of_the_data_phase(tmp_path, caplog):
    """The DDP case of the issue: rank 0's shard ended inside the window, and the "data" phase opened after the
    last step stayed open through validation (40% data on the profiler's line, 1% on the epoch line)."""
    profiler = StepProfiler(profiler_config(wait=0, warmup=1, active=3), tmp_path, torch.device("cpu"))
    timer = ProfiledTimer(profiler)
    with caplog.at_level(logging.INFO, logger="trainkit.tracking.profiling"):
        for _ in range(2):  # two epochs of two steps: the window is steps 1-3, across the epoch end
            timer.start_epoch(torch.device("cpu"))
            for _ in range(2):
                timer.batch_ready()
                time.sleep(0.02)  # the step
                timer.step_done()
            timer.epoch_metrics()
            time.sleep(0.2)  # validation
    shares = json.loads((tmp_path / "profile" / "phases.json").read_text())
    assert shares["data"] < 0.1 and shares["forward"] > 0.8
    assert "share of steps 1-3 under the profiler" in caplog.text


# ---- the timer that drives it: the loop's marks passed on, its own work no wait for data ----


def test_the_loop_marks_each_point_once_and_the_profiled_timer_passes_it_to_the_profiler():
    class RecordingProfiler:
        profile, recording = "on", True

        def __init__(self) -> None:
            self.calls: list[str] = []

        def phase(self, name: str) -> None:
            self.calls.append(name)

        def step(self) -> None:
            self.calls.append("step")

    profiler = RecordingProfiler()
    timer = ProfiledTimer(profiler)  # type: ignore[arg-type]
    timer.start_epoch(CPU, skip_first=True)  # the compile step too is a profiled step
    for _ in range(2):
        timer.batch_ready()
        timer.phase("backward")
        timer.step_done()
    assert profiler.calls == ["forward", "backward", "step"] * 2


class SlowProfiler:
    """debug=profile's StepProfiler as the timer sees it: its step() does its own work (the trace it writes
    at the window's end takes seconds), here 40 ms a step from its second on; it records steps 1-2."""

    def __init__(self) -> None:
        self.profile, self.steps = "on", 0

    @property
    def recording(self) -> bool:
        return 1 <= self.steps <= 2

    def phase(self, name: str) -> None:
        pass

    def pause(self) -> None:
        pass

    def step(self) -> None:
        self.steps += 1
        time.sleep(0.04 if self.steps >= 2 else 0.0)


@pytest.mark.usefixtures("fake_cuda")  # the CUDA branch of the timer, on this machine (test_timing.py's)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_profiler_s_own_work_is_not_waiting_for_data_and_its_steps_are_counted(device):
    timer = ProfiledTimer(SlowProfiler())  # type: ignore[arg-type]
    metrics = timed_epoch(timer, 5, wait_s=0.0, step_s=0.01, device=torch.device(device))
    assert metrics["train/data_wait_fraction"] < 0.2  # 3 x 40 ms of the profiler's would be 70% of the wait
    assert metrics["train/profiled_steps"] == 2


def test_the_profiler_s_line_names_its_steps_and_gives_the_advice_for_the_data_option():
    """Digits in memory: a data-bound window advises the batch size, not workers, pinned memory or a cache."""
    data = OmegaConf.load(CONF / "digits.yaml")
    loader = TensorLoader(torch.zeros(64, 1, 8, 8), torch.zeros(64, dtype=torch.int64), 8, shuffle=True)
    shares = {"data": 0.4, "forward": 0.3, "backward": 0.3}
    line = describe(shares, (7, 11), data_bound_advice(loader, data, on_cuda=False))
    assert line.startswith("share of steps 7-11 under the profiler: data 40%")
    assert "data loading is the bottleneck" in line and "raise data.batch_size (now 64)" in line
    assert "workers and pinned memory do not apply" in line and "num_workers=" not in line
    assert "preprocess.py" not in line and "a cache" not in line
    assert "reads lower here than on the epoch line" in line


# ---- its config checks, beside its code (trainkit.config.validation gathers them) ------------------------

RULE_CASES = [
    (["profiler.enabled=yes"], "profiler.enabled"),
    (["profiler.wait=-1"], "profiler.wait"),
    (["profiler.warmup=0.5"], "profiler.warmup"),
    (["profiler.active=0"], "profiler.active"),
    (["profiler.row_limit=0"], "profiler.row_limit"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    profiling, RULE_CASES, []
)
