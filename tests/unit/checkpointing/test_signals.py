"""Clean stops: SIGTERM / SIGUSR1 / SIGINT (trainkit.checkpointing.signals) and a non-finite loss, in one process.
The same under DDP: tests/unit/distributed/test_distributed.py."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TrainRun, run_here
from helpers import assert_same_training
from trainkit.checkpointing import signals

TESTS = Path(__file__).resolve().parents[2]
# 8 batches an epoch, a metrics line after every update: the test signals after the third one.
OVERRIDES = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=8",
    "augmentation=shift",
    "trainer.progress_bar=false",
    "print_config=false",
    "regularization.early_stopping.enabled=false",
    "trainer.log_every_n_steps=1",
]


def test_a_stop_signal_is_recorded_and_the_previous_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with signals.stop_on_signals():
        assert signals.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested() == "SIGUSR1"  # the first names the stop
        assert signals.stop_signal(torch.device("cpu"), agree=False) == "SIGUSR1"  # one process: at every update
    assert signal.getsignal(signal.SIGTERM) is before and signals.requested() is None


SECOND_CTRL_C = """
import os, signal, time
from trainkit.checkpointing.signals import requested, stop_on_signals
with stop_on_signals():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C passed on by torchrun's agent: still one request
    print(requested(), flush=True)
    time.sleep(1.5)
    os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C
    time.sleep(30)
"""


@pytest.mark.slow  # trains in a subprocess
def test_a_second_ctrl_c_aborts_at_once():
    result = subprocess.run([sys.executable, "-c", SECOND_CTRL_C], capture_output=True, text=True, timeout=120)
    assert result.returncode == signals.EXIT_ABORTED, result.stderr
    assert result.stdout.split() == ["SIGINT"]
    assert result.stderr.strip() == "aborted by a second Ctrl-C; checkpoints/last.pt is as last saved"


def start_train(run_dir: Path, *overrides: str, stderr: int = subprocess.PIPE) -> subprocess.Popen:
    """train.py in a process group of its own with SIGINT at its default (a shell's background job
    ignores SIGINT, and a child would inherit that), as a terminal's foreground job. `stderr`:
    subprocess.STDOUT reads both streams as one, in order."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_metrics(process: subprocess.Popen, run_dir: Path, lines: int, timeout: float = 240) -> None:
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            return
        time.sleep(0.01)
    raise AssertionError(f"no {lines} metrics lines in time: {process.communicate()[1][-3000:]}")


def interrupt(
    run_dir: Path, signum: int, overrides=OVERRIDES, after_lines: int = 3, again_after: float | None = None
) -> TrainRun:
    """Start a run, send `signum` to its process group after `after_lines` metrics lines (and
    again `again_after` seconds later: an impatient user), wait."""
    process = start_train(run_dir, *overrides)
    try:
        wait_for_metrics(process, run_dir, after_lines)
        os.killpg(process.pid, signum)
        if again_after is not None:
            time.sleep(again_after)
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                os.killpg(process.pid, signum)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return TrainRun(process.returncode, stdout, stderr, run_dir)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The run the stopped one would have been, in this process: nothing of it is a process's (no signal)."""
    run_dir = tmp_path_factory.mktemp("straight")
    run = TrainRun(*run_here("train.py", f"hydra.run.dir={run_dir}", *OVERRIDES), run_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.slow  # trains in a subprocess
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_saves_at_the_step_exits_75_in_one_line_and_the_run_resumes_exactly(
    signum, run_train, tmp_path, request
):
    # Ctrl-C twice, 0.5 s apart: the same Ctrl-C, or a second one once the checkpoint is saved: still 75.
    stopped = interrupt(tmp_path / "stopped", signum, again_after=0.5 if signum == signal.SIGINT else None)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == signals.EXIT_STOPPED, output[-3000:]
    assert "Traceback" not in output
    checkpoint = torch.load(stopped.run_dir / "checkpoints" / "last.pt", weights_only=True)
    # Saved at the update it stopped after: the last one logged, inside an epoch.
    assert checkpoint["step"] == stopped.metrics[-1]["step"] and 0 < checkpoint["batches_done"] < 8
    name = signal.Signals(signum).name
    [line] = [line for line in output.splitlines() if "stopped by" in line or "resume=" in line]
    assert line.endswith(f"resume={stopped.run_dir / 'checkpoints' / 'last.pt'}")
    assert f"stopped by {name} at epoch {checkpoint['epoch']}, step {checkpoint['step']}" in line
    assert not (stopped.run_dir / "summary.json").exists()  # not finished: no summary yet

    if signum == signal.SIGINT:  # the saved position does not depend on the signal: one resume shows it exact
        resumed = run_train(f"resume={stopped.run_dir / 'checkpoints' / 'last.pt'}", run_dir=stopped.run_dir)
        assert_same_training(resumed, request.getfixturevalue("straight"))


def strict_json(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow  # trains in this process (run_train)
def test_a_non_finite_loss_stops_at_the_next_logging_step_keeps_the_last_finite_checkpoint_and_exits_1(
    run_train, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    # NaN logits at the 5th update: the weights are NaN from then on. Checkpoints every 2 updates
    # (steps 2 and 4 are fine), a metrics line every 3: found at step 6, inside epoch 0.
    run = run_train(
        "trainer.max_epochs=3",
        "trainer.progress_bar=false",
        "print_config=false",
        "model._target_=models_for_tests.NanOnRankOne",
        "model.widths=[16,32]",
        "+model.nan_at=5",
        "+model.nan_rank=0",
        "trainer.checkpoint_every_n_steps=2",
        "trainer.log_every_n_steps=3",
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert "train/loss is not finite at epoch 0, step 6: lower optimizer.lr or set trainer.grad_clip" in output
    summary = strict_json((run.run_dir / "summary.json").read_text())  # no bare NaN
    assert summary["stop_reason"] == "non-finite loss" and summary["steps"] == 6
    assert summary["test"]["test/loss"] is None  # tested with the NaN weights (no epoch ended: no best.pt)
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["step"] == 4
    assert all(torch.isfinite(tensor).all() for tensor in checkpoint["model"].values())


def test_a_non_finite_loss_before_any_checkpoint_or_validation_says_so_in_one_line_and_exits_1(run_train):
    """In process: NaN from the 2nd update, found at step 3 of epoch 0: no checkpoint, no validated epoch."""
    run = run_train(
        "trainer.max_epochs=2",
        "trainer.progress_bar=false",
        "print_config=false",
        "model._target_=models_for_tests.NanOnRankOne",
        "model.widths=[8,16]",
        "+model.nan_at=2",
        "+model.nan_rank=0",
        "trainer.log_every_n_steps=3",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=1",
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1 and not (run.run_dir / "checkpoints" / "last.pt").exists()
    assert (
        "train/loss is not finite at epoch 0, step 3: lower optimizer.lr or set trainer.grad_clip (no checkpoint "
        "was saved before it)" in output
    )
    assert "keeps the last finite weights" not in output and "best.pt is missing" not in output
    assert "Error executing job" not in output and "error:" not in output  # the line above is the one error line
    assert "(the last weights: no epoch was validated)" in output and "epoch None" not in output
    assert run.summary["test_weights"] == "last (no epoch)" and run.summary["best"] == {}


def test_a_stop_line_names_its_resume_unless_a_command_that_continues_more_is_named(tmp_path, caplog, monkeypatch):
    """A job of a sweep that a rerun continues names the rerun (CONTINUE_WITH_ENV, set by sweep continuation);
    without one, any stopped run names its own resume=."""
    monkeypatch.delenv(signals.CONTINUE_WITH_ENV, raising=False)
    with signals.stop_on_signals():
        assert isinstance(signals.stopped("SIGTERM", tmp_path, 0, 3, is_main=True), signals.Stopped)
    assert caplog.text.rstrip().endswith(
        f"continue with: python train.py resume={tmp_path.resolve()}/checkpoints/last.pt"
    )
    caplog.clear()
    monkeypatch.setenv(signals.CONTINUE_WITH_ENV, "python train.py -m seed=1,2 hydra.sweep.dir=/sweep")
    with signals.stop_on_signals():
        signals.stopped("SIGTERM", tmp_path, 0, 3, is_main=True)
    assert caplog.text.rstrip().endswith("continue with: python train.py -m seed=1,2 hydra.sweep.dir=/sweep")


def test_sighup_is_a_stop_request_and_sigquit_is_left_alone():
    quit_before = signal.getsignal(signal.SIGQUIT)
    hangup_before = signal.signal(signal.SIGHUP, lambda signum, frame: None)  # were it not handled: no death
    try:
        with signals.stop_on_signals():
            os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal, a dropped ssh session
            assert signals.requested() == "SIGHUP"
            assert signal.getsignal(signal.SIGQUIT) is quit_before  # Ctrl-\ still quits at once
    finally:
        signal.signal(signal.SIGHUP, hangup_before)


def test_once_the_checkpoint_is_saved_a_late_signal_cannot_change_the_exit(stop_handlers_back, tmp_path):
    with pytest.raises(signals.Stopped), signals.stop_on_signals():
        os.kill(os.getpid(), signal.SIGINT)
        raise signals.stopped("SIGINT", tmp_path, epoch=0, step=3, is_main=True)  # after the save
    # Python's handler back here would turn an impatient second Ctrl-C into a death by SIGINT (-2).
    assert all(signal.getsignal(s) is signal.SIG_IGN for s in signals.STOP_SIGNALS)


def test_a_run_directory_named_with_commas_and_non_ascii_stops_and_resumes_with_the_printed_command(
    tmp_path, monkeypatch, stop_handlers_back
):
    """Hydra's hydra.sweep.subdir=${hydra.job.override_dirname} names directories like this one."""
    import shlex

    from trainkit import checkpointing
    from trainkit.checkpointing.overrides import hydra_quote

    run_dir = tmp_path / "optimizer.lr=0.1,seed=1 é"
    real, calls = checkpointing.stop_signal, iter(range(1000))

    def signalled_at_the_third_update(device, agree):
        if next(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(device, agree)

    monkeypatch.setattr(checkpointing, "stop_signal", signalled_at_the_third_update)  # train.py imports it anew
    one_epoch = [*OVERRIDES, "trainer.max_epochs=1", "trainer.limit_train_batches=4"]
    code, _, stderr = run_here("train.py", f"hydra.run.dir={hydra_quote(str(run_dir))}", *one_epoch)
    log = (run_dir / "train.log").read_text()
    assert code == signals.EXIT_STOPPED, (stderr + log)[-3000:]
    [line] = [line for line in log.splitlines() if "continue with: " in line]
    command = shlex.split(line.split("continue with: ")[1])  # pasted into a shell
    assert command[:2] == ["python", "train.py"] and command[2] == f"resume={run_dir / 'checkpoints' / 'last.pt'}"
    monkeypatch.setattr(checkpointing, "stop_signal", real)
    code, _, stderr = run_here(*command[1:])
    assert code == 0, stderr[-3000:]
    assert f"resuming {run_dir / 'checkpoints' / 'last.pt'} at epoch 0, batch 3" in (run_dir / "train.log").read_text()
    assert (run_dir / "summary.json").exists()


def test_a_signal_during_the_final_test_lets_it_finish_then_says_so_and_exits_75(
    tmp_path, monkeypatch, stop_handlers_back
):
    from trainkit import run as run_module
    from trainkit import tasks

    real, calls = tasks.evaluate, iter(range(1000))

    def signalled_in_the_test(*args, **kwargs):
        if next(calls) == 1:  # one epoch: its validation, then the test
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks, "evaluate", signalled_in_the_test)  # train.py imports it anew: the validation
    monkeypatch.setattr(run_module, "evaluate", signalled_in_the_test)  # the test (trainkit.run.test_and_summarize)
    one_epoch = [*OVERRIDES, "trainer.max_epochs=1", "trainer.limit_train_batches=2"]
    code, _, stderr = run_here("train.py", f"hydra.run.dir={tmp_path}", *one_epoch)
    log = (tmp_path / "train.log").read_text()
    assert code == signals.EXIT_STOPPED, (stderr + log)[-3000:]
    [line] = [line for line in log.splitlines() if "stopped by" in line]
    assert line.endswith(
        f"stopped by SIGTERM at epoch 0, step 2, after training to its end: its test finished and "
        f"{tmp_path.resolve() / 'summary.json'} is written (exit code 75); nothing is left to resume"
    )
    # The test ran to its end over the whole split: its line in metrics.jsonl is summary.json's, and test/acc counts
    # the 359 test digits.
    summary, run = json.loads((tmp_path / "summary.json").read_text()), TrainRun(code, "", stderr, tmp_path)
    assert run.metrics[-1] == {"epoch": 0, "step": 2, **summary["test"]} and summary["stop_reason"] == "max_epochs"
    assert summary["test"]["test/acc"] * 359 == pytest.approx(round(summary["test"]["test/acc"] * 359), abs=1e-3)
    code, _, stderr = run_here("train.py", f"hydra.run.dir={tmp_path}", f"resume={tmp_path}")
    assert code == 0 and "has finished" in (tmp_path / "train.log").read_text(), stderr[-3000:]


@pytest.mark.slow  # starts train.py in a subprocess
def test_ctrl_c_while_torch_imports_stops_in_one_line_with_exit_75(tmp_path):
    assert_ctrl_c_while_torch_imports_stops_in_one_line(tmp_path)


def assert_ctrl_c_while_torch_imports_stops_in_one_line(tmp_path: Path, *overrides: str) -> None:
    """Python's default would print a KeyboardInterrupt traceback from inside `import torch`."""
    process = start_train(tmp_path, "print_config=false", *overrides, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.3)  # the interpreter is up; torch and Hydra import for seconds
        os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=240)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == signals.EXIT_STOPPED, output[-3000:]
    assert output.strip().endswith(
        "stopped by SIGINT while starting, before training: nothing trained or saved (exit code 75); "
        "start again with the same command (resume=auto starts afresh)"
    )
    assert len(output.strip().splitlines()) == 1 and "launching" not in output, output[-3000:]
