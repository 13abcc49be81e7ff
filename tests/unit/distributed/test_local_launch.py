"""train.py starting its own DDP workers (trainkit.distributed.local_launch: distributed=ddp with
distributed.nproc_per_node=N, no torchrun): the parent's part. What the workers do as a process group is the core's,
tested under torchrun in test_distributed.py."""

import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers import hashes_of_every_file, needs_image_folders, unchanged_but_the_record
from trainkit.checkpointing import signals
from trainkit.distributed import local_launch
from unit.checkpointing.test_signals import OVERRIDES, assert_ctrl_c_while_torch_imports_stops_in_one_line, start_train
from unit.distributed.test_distributed import (
    QUICK,
    STOP_AND_RESUME,
    assert_resumed_exactly,
    metrics_lines,
    read_run,
    run,
    signal_after_metrics,
    start_in_own_group,
    train_command,
)

DDP = ("distributed=ddp", "distributed.nproc_per_node=2")


@pytest.fixture(scope="module")
def straight_self_launched_run(tmp_path_factory) -> Path:
    """The run directory of one uninterrupted 2-worker run with STOP_AND_RESUME, its workers started by train.py."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    result = run(train_command(f"hydra.run.dir={run_dir}", *STOP_AND_RESUME, *DDP))
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_workers_get_the_config_unresolved_so_a_key_filled_later_reaches_its_interpolations():
    """The cause of the bug below, in-process: data.num_classes=null is filled from the image folder
    inside each worker, after the hand-off; model.num_classes interpolates it."""
    from trainkit.config import resolved
    from trainkit.distributed.local_launch import worker_config

    parent = OmegaConf.create({"data": {"num_classes": None}, "model": {"num_classes": "${data.num_classes}"}})
    worker = OmegaConf.create(worker_config(parent))
    assert resolved(worker, {"data.num_classes": 3}).model.num_classes == 3  # as build_run, once the data is built


@pytest.mark.slow
def test_self_launched_ddp_inside_a_hydra_multirun(tmp_path):
    result = run(
        train_command(
            "-m",
            f"hydra.sweep.dir={tmp_path}",
            "distributed=ddp",
            "distributed.nproc_per_node=2",
            "seed=1,2",
            *QUICK,
            "trainer.limit_train_batches=3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in (("0", 1), ("1", 2)):
        summary, _ = read_run(tmp_path / job)
        assert summary["world_size"] == 2 and summary["steps"] == 6  # 2 epochs x 3 batches
        assert OmegaConf.load(tmp_path / job / ".hydra" / "config.yaml").seed == seed
        assert torch.load(tmp_path / job / "checkpoints" / "last.pt", weights_only=True)["config"]["seed"] == seed


@needs_image_folders
@pytest.mark.slow
def test_self_launched_ddp_on_an_image_folder_counts_its_classes(tmp_path):
    from PIL import Image

    for label in range(3):
        folder = tmp_path / "images" / "train" / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(4):
            Image.new("RGB", (8, 8), (80 * label, 40 * index, 0)).save(folder / f"{index}.png")
    result = run(
        train_command(
            "data=imagefolder",
            f"data.root={tmp_path / 'images'}",
            "data.image_size=8",
            "data.num_workers=0",
            "data.batch_size=2",
            "data.val_fraction=0.25",
            "data.test_fraction=0.25",
            "distributed=ddp",
            "distributed.nproc_per_node=2",
            "trainer.max_epochs=1",
            "trainer.progress_bar=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary, _ = read_run(tmp_path / "run")
    assert summary["world_size"] == 2
    weights = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert weights["config"]["model"]["num_classes"] == 3  # the folder's count, not null


@pytest.mark.slow
def test_a_crashing_worker_ends_the_whole_job_quickly_and_the_parent_names_it(tmp_path):
    command = train_command(
        f"hydra.run.dir={tmp_path}",
        *DDP,
        *QUICK,
        "model._target_=models_for_tests.CrashOnRankOne",
        "model.widths=[16,32]",
        "trainer.max_epochs=50",
    )
    started = time.monotonic()
    result = run(command, timeout=120)
    assert result.returncode == 1
    assert time.monotonic() - started < 60
    assert "simulated crash on rank 1" in result.stderr
    assert "error: DDP worker rank" in result.stderr and "its error is printed above" in result.stderr


@pytest.mark.slow
def test_sigterm_to_the_parent_of_ddp_workers_stops_every_rank_at_one_step_and_resumes_exactly(
    tmp_path, straight_self_launched_run
):
    stopped = start_in_own_group(train_command(f"hydra.run.dir={tmp_path / 'stopped'}", *STOP_AND_RESUME, *DDP))
    output = signal_after_metrics(stopped, tmp_path / "stopped", lambda pid: os.kill(pid, signal.SIGTERM))
    assert stopped.returncode == 75, output[-3000:]
    assert "Traceback" not in output and "leaked" not in output and "death signal" not in output
    [line] = [line for line in output.splitlines() if "stopped by" in line]
    assert "stopped by SIGTERM" in line and line.endswith(f"resume={tmp_path / 'stopped/checkpoints/last.pt'}")
    checkpoint = torch.load(tmp_path / "stopped/checkpoints/last.pt", weights_only=True)
    metrics = metrics_lines(tmp_path / "stopped")
    # Both ranks saved together (their RNG streams are in it) after the last logged update, mid-epoch.
    assert checkpoint["step"] == metrics[-1]["step"] and 0 < checkpoint["batches_done"] < 10
    assert len(checkpoint["rng"]) == 2

    # The printed command, as a user would paste it: it continues in the stopped run's directory.
    resumed = run(train_command(f"resume={tmp_path / 'stopped/checkpoints/last.pt'}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_exactly(tmp_path / "stopped", straight_self_launched_run)


def test_a_function_the_workers_cannot_import_by_name_is_refused_before_any_worker_starts(tmp_path):
    from trainkit.distributed import launch

    cfg = OmegaConf.create(
        {
            "device": "cpu",
            "precision": {"tf32": False},
            "trainer": {"cudnn_benchmark": False, "deterministic": False},
            "distributed": {"name": "ddp", "backend": "auto", "timeout_seconds": 60, "nproc_per_node": 2},
        }
    )

    def train_process(cfg, run_dir, proc, device):
        return "summary"

    with pytest.raises(TypeError, match="is not a module-level function of its script"):
        launch.start_processes(cfg, tmp_path, train_process)


def report_signal(path: Path) -> None:
    """A stand-in DDP worker (forked): writes the name of the first signal it gets."""

    def handle(signum, frame):
        path.write_text(signal.Signals(signum).name)
        os._exit(0)

    for s in signals.STOP_SIGNALS:
        signal.signal(s, handle)
    path.with_suffix(".ready").touch()
    time.sleep(30)
    os._exit(1)


def test_the_parent_of_ddp_workers_passes_on_the_signal_the_user_sent(stop_handlers_back, tmp_path):
    fork = multiprocessing.get_context("fork")
    # A child from before the launch (the W&B service an earlier job of a multirun started) is no worker.
    bystander = fork.Process(target=report_signal, args=(tmp_path / "bystander",))
    bystander.start()
    worker = fork.Process(target=report_signal, args=(tmp_path / "got",))
    with local_launch.forward_to_workers():
        worker.start()
        while not (tmp_path / "got.ready").exists() or not (tmp_path / "bystander.ready").exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the stop line must say SIGINT, not SIGTERM
        worker.join(20)
    assert (tmp_path / "got").read_text() == "SIGINT"
    assert bystander.is_alive() and not (tmp_path / "bystander").exists()
    bystander.kill()
    bystander.join()


def write_blocked_signals(rank: int, path: str) -> None:
    Path(path).write_text(" ".join(str(int(s)) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_ddp_workers_start_with_the_stop_signals_blocked_until_they_listen(tmp_path):
    import torch.multiprocessing

    with local_launch._workers_start_with_stop_signals_blocked():
        started = torch.multiprocessing.start_processes(
            write_blocked_signals, args=(str(tmp_path / "mask"),), nprocs=1, join=False, start_method="fork"
        )
        started.join(30)
    blocked = {signal.Signals(int(s)) for s in (tmp_path / "mask").read_text().split()}
    assert set(signals.STOP_SIGNALS) <= blocked  # a signal while it imports waits for its handlers
    assert not set(signals.STOP_SIGNALS) & set(signal.pthread_sigmask(signal.SIG_BLOCK, []))  # not this process


def signalled_while_workers_start(process: subprocess.Popen, send) -> str:
    """`send(pid)` once the parent says it launches the workers (they import torch for seconds); the whole output."""
    try:
        output = ""
        for line in process.stdout:
            output += line
            if "launching 2 DDP processes" in line:
                break
        time.sleep(0.2)
        send(process.pid)
        return output + process.communicate(timeout=240)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow  # DDP workers are processes
def test_sigterm_while_the_ddp_workers_of_a_one_epoch_run_start_is_said_and_exits_75(tmp_path):
    """Its 10 updates have no logging step (log_every_n_steps 50) where the ranks could agree to stop
    inside the epoch, and the epoch's end finishes the run: it tests, then stops in one line."""
    ddp = ("distributed=ddp", "distributed.nproc_per_node=2", "trainer.max_epochs=1", "trainer.progress_bar=false")
    process = start_train(tmp_path, "print_config=false", *ddp, stderr=subprocess.STDOUT)
    # to the parent alone, as scancel or a job manager would
    output = signalled_while_workers_start(process, lambda pid: os.kill(pid, signal.SIGTERM))
    assert process.returncode == signals.EXIT_STOPPED, output[-3000:]
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if "stopped by" in line]
    assert "stopped by SIGTERM at epoch 0, step 10, after training to its end" in line and "(exit code 75)" in line


@pytest.mark.slow  # DDP workers are processes
def test_ctrl_c_while_ddp_workers_start_stops_in_one_line_naming_sigint(tmp_path):
    ddp = ("distributed=ddp", "distributed.nproc_per_node=2")
    process = start_train(tmp_path, *OVERRIDES, *ddp, stderr=subprocess.STDOUT)
    # a terminal's Ctrl-C reaches the parent and its workers
    output = signalled_while_workers_start(process, lambda pid: os.killpg(pid, signal.SIGINT))
    assert process.returncode == signals.EXIT_STOPPED, output[-3000:]
    assert "Traceback" not in output and "Error executing job" not in output and "KeyboardInterrupt" not in output
    [line] = [line for line in output.splitlines() if "stopped by" in line]
    assert "stopped by SIGINT" in line and "(exit code 75)" in line


@pytest.mark.slow  # starts train.py in a subprocess (and DDP workers are processes)
def test_ctrl_c_while_torch_imports_before_any_worker_stops_in_one_line_with_exit_75(tmp_path):
    assert_ctrl_c_while_torch_imports_stops_in_one_line(tmp_path, *DDP)


@pytest.mark.slow  # starts DDP workers twice
def test_a_resume_refused_inside_ddp_workers_is_one_line_and_leaves_every_file_as_it_was(run_train):
    """The data's fingerprint is checked in the workers (they build the data): rank 0 hands its refusal back
    to the parent, which refuses the call as one process would, not as a worker's exit code under Hydra's
    "Error executing job" with the record rewritten."""
    first = run_train("debug=fast", *DDP, self_launched=True)
    before = hashes_of_every_file(first.run_dir)
    refused = run_train(
        f"resume={first.run_dir}",
        "trainer.max_epochs=3",
        "data.split_seed=5",
        run_dir=first.run_dir,
        check=False,
    )
    assert refused.returncode == 1
    errors = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: data: the train split holds other values"), errors
    assert "Error executing job" not in refused.stdout + refused.stderr
    assert unchanged_but_the_record(first.run_dir, before)
