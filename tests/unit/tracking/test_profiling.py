import json
import logging
import time

import pytest
import torch

from trainkit.tracking.profiling import PHASES, StepProfiler, describe, phase_shares


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
    from trainkit.tracking.timing import LoopTimer

    profiler = StepProfiler(profiler_config(wait=0, warmup=1, active=3), tmp_path, torch.device("cpu"))
    timer = LoopTimer(profiler)
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
