"""SLURM through Hydra's submitit launcher (hydra/launcher=slurm): its config, and submitit's signal, which stops
the run like any stop signal; after the checkpoint submitit's handler requeues the job
(trainkit.checkpointing.submitit_requeue)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import test_signals
import yaml
from test_signals import OVERRIDES, wait_for_metrics

from conftest import ROOT, TrainRun, run_here
from helpers import assert_same_training
from trainkit.checkpointing import signals

straight = test_signals.straight  # the uninterrupted run a requeued one must equal (a fixture)


@pytest.fixture
def submitit_job(monkeypatch):
    """This process as a submitit job's task: SUBMITIT_EXECUTOR set and, as submitit's process_job
    installs it, a handler on its preemption signal: it records its calls and requeues (exits 144,
    as submitit's local executor does) or returns (a task other than the first)."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    calls = []

    def submitits_handler(signum, frame):
        calls.append((signum, frame))
        if handler.first_task:
            sys.exit(144)

    handler = submitits_handler
    handler.first_task, handler.calls = True, calls
    previous = signal.signal(signal.SIGUSR2, handler)
    yield handler
    signal.signal(signal.SIGUSR2, previous)


def test_under_submitit_its_signal_stops_and_hands_over_to_its_requeue_after_the_checkpoint(submitit_job, tmp_path):
    with signals.stop_on_signals():
        os.kill(os.getpid(), signal.SIGUSR2)
        assert signals.requested() == "SIGUSR2" and submitit_job.calls == []  # recorded; nothing requeued yet
        leaving = signals.stopped("SIGUSR2", tmp_path, epoch=0, step=3, is_main=True)  # after the save
    assert submitit_job.calls == [(signal.SIGUSR2, None)]  # submitit's handler, once, as the signal would have
    assert type(leaving) is SystemExit and leaving.code == 144  # requeued: submitit's exit, not 75
    assert signal.getsignal(signal.SIGUSR2) is submitit_job  # its handler back

    submitit_job.first_task = False  # another task: submitit requeues from the first one only
    with signals.stop_on_signals():
        os.kill(os.getpid(), signal.SIGUSR2)
        leaving = signals.stopped("SIGUSR2", tmp_path, epoch=0, step=3, is_main=False)
    assert isinstance(leaving, signals.Stopped) and leaving.code == signals.EXIT_STOPPED

    with signals.stop_on_signals():  # SIGTERM (scancel; SLURM's own preemption notice): a plain stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert isinstance(signals.stopped("SIGTERM", tmp_path, 0, 3, is_main=True), signals.Stopped)
    assert len(submitit_job.calls) == 2


def test_when_submitit_declines_to_requeue_the_run_exits_75_saying_why(submitit_job, tmp_path, caplog):
    def declines(signum, frame):
        raise RuntimeError("Job not requeued because: timed-out too many times.")  # submitit's UncompletedJobError

    signal.signal(signal.SIGUSR2, declines)
    with signals.stop_on_signals():
        os.kill(os.getpid(), signal.SIGUSR2)
        leaving = signals.stopped("SIGUSR2", tmp_path, epoch=1, step=9, is_main=True)
    assert isinstance(leaving, signals.Stopped) and leaving.code == signals.EXIT_STOPPED
    assert "not requeued: Job not requeued because: timed-out too many times." in caplog.text
    assert f"continue with: python train.py resume={tmp_path.resolve() / 'checkpoints' / 'last.pt'}" in caplog.text


def test_outside_submitit_its_signal_is_left_alone(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    before = signal.getsignal(signal.SIGUSR2)
    with signals.stop_on_signals():
        assert signal.getsignal(signal.SIGUSR2) is before
    assert "SIGUSR2" in signals.STOP_SIGNAL_NAMES  # the same names where train.py is pickled for a submitit job


def submitit_task(sweep_dir: Path) -> int:
    """The pid of the job's task: the local executor's job id is its controller's pid."""
    [controller] = [path.name for path in (sweep_dir / ".submitit").iterdir() if path.name.isdigit()]
    return int(Path(f"/proc/{controller}/task/{controller}/children").read_text().split()[0])


@pytest.mark.slow
def test_under_the_submitit_launcher_a_preemption_saves_at_the_step_requeues_and_continues_exactly(straight, tmp_path):
    """Hydra's submitit launcher with submitit's local executor: its preemption signal (SIGUSR2),
    sent to the job's task as the controller sends it before a timeout. The task saves at the step
    and submitit requeues it; the requeued task continues with resume=auto and ends as a straight run."""
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={sweep}",
    ]
    process = subprocess.Popen(
        [*command, "resume=auto", *OVERRIDES],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    run_dir = sweep / "0"
    try:
        wait_for_metrics(process, run_dir, 3)
        os.kill(submitit_task(sweep), signal.SIGUSR2)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    log = (run_dir / "train.log").read_text()
    assert process.returncode == 0, (stderr + log)[-3000:]
    [line] = [line for line in log.splitlines() if "stopped by" in line]
    step = int(line.split("step ")[1].split(",")[0])
    assert 0 < step < 8  # inside epoch 0
    assert line.endswith(
        f"stopped by SIGUSR2 at epoch 0, step {step}, checkpoint saved; submitit requeued the job: it continues "
        f"from {run_dir / 'checkpoints' / 'last.pt'} with resume=auto"
    )
    assert "Requeued job" in log  # submitit's own line: its handler ran after the checkpoint
    assert f"resuming {run_dir / 'checkpoints' / 'last.pt'} at epoch 0, batch {step}, step {step}" in log
    assert "Traceback" not in log + stderr
    assert_same_training(TrainRun(0, stdout, stderr, run_dir), straight)


def launcher_config(*overrides: str) -> dict:
    """hydra.launcher as `python train.py hydra/launcher=slurm ... --cfg all` prints it (`--resolve`: resolved)."""
    command = ["train.py", "hydra/launcher=slurm", *overrides, "--cfg", "all", "--package", "hydra.launcher"]
    return yaml.safe_load(run_here(*command)[1])


def test_slurm_launcher_composes_one_task_per_gpu_and_prints_from_the_command_line():
    printed = launcher_config()
    assert printed["_target_"].endswith("SlurmLauncher")
    assert printed["tasks_per_node"] == "${distributed.nproc_per_node}"
    launcher = launcher_config("--resolve")
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == 1
    assert launcher["partition"] is None and launcher["timeout_min"] > 0 and launcher["cpus_per_task"] >= 1
    launcher = launcher_config("distributed=ddp", "distributed.nproc_per_node=4", "--resolve")
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == 4
