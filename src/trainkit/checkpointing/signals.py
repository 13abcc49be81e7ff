"""Stop a run cleanly on SIGTERM, SIGUSR1, SIGINT or SIGHUP: finish the optimizer step, save, exit 75.

SLURM sends SIGTERM (or --signal's USR1) before a time limit or a preemption, Ctrl-C SIGINT, a closed terminal or ssh
session SIGHUP; SIGQUIT (Ctrl-\\) quits at once, unsaved. A handler only records the request: train.py's `stop_reason`
reads it after each update; the run saves checkpoints/last.pt, says how to resume and exits 75. A second Ctrl-C before
that aborts (exit 130); a SIGINT within SAME_CTRL_C_SECONDS of the first (the terminal's and torchrun's) is the same
one. Under DDP the ranks agree on a stop only where the loop synchronizes: each logging step, each epoch's end."""

import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

import trainkit.checkpointing.submitit_requeue as submitit_requeue  # feature: slurm
from trainkit import startup
from trainkit.checkpointing.files import latest_checkpoint
from trainkit.distributed.process_group import barrier, process_info
from trainkit.startup import EXIT_STOPPED, SAME_CTRL_C_SECONDS, STOP_SIGNALS

log = logging.getLogger("train")

EXIT_ABORTED = 130  # a second Ctrl-C: what a shell reports for a process ended by SIGINT
# A command that continues more than this run (a sweep's rerun), named by the stop lines instead of resume=; in the
# environment so that sweep workers and DDP workers inherit it.
CONTINUE_WITH_ENV = "TRAINKIT_CONTINUE_WITH"

# Not read from the environment at import: submitit pickles train.py's functions and globals by value.
STOP_SIGNAL_NAMES = tuple(s.name for s in STOP_SIGNALS)
STOP_SIGNAL_NAMES = tuple(dict.fromkeys([*STOP_SIGNAL_NAMES, *submitit_requeue.SIGNAL_NAMES]))  # feature: slurm


class Stopped(SystemExit):
    """A clean stop on a signal, after the checkpoint is written: the process exits with EXIT_STOPPED. A SystemExit, so
    no `except Exception` (a sweep's trial guard) swallows it and a multirun stops too."""

    def __init__(self, code: int = EXIT_STOPPED):
        super().__init__(code)


_requested: str | None = None  # the first stop signal this process received
_first_ctrl_c: float | None = None  # when (time.monotonic) the first SIGINT came
_saved = False  # the stop is done (checkpoint written, or nothing to write): later signals change nothing


def requested() -> str | None:
    """The name of the first stop signal this process received (e.g. "SIGTERM"), or None."""
    return _requested


def request(name: str) -> None:
    """Record a stop request named `name` as if its signal had come (the first request names the stop)."""
    global _requested
    _requested = _requested or name


class Abort(Exception):
    """A second Ctrl-C (never leaves a handler: each handler turns it into an exit)."""


def record_stop(signum: int) -> None:
    """Record a stop request; a later Ctrl-C aborts, unless the checkpoint is written already."""
    global _requested, _first_ctrl_c
    if _saved:
        return
    submitit_requeue.record(signum)  # feature: slurm
    if signum == signal.SIGINT:
        now = time.monotonic()
        if _first_ctrl_c is not None and now - _first_ctrl_c > SAME_CTRL_C_SECONDS:
            raise Abort
        _first_ctrl_c = _first_ctrl_c or now
    _requested = _requested or signal.Signals(signum).name


def abort(announce: bool) -> None:
    if announce:
        print("aborted by a second Ctrl-C; checkpoints/last.pt is as last saved", file=sys.stderr, flush=True)
    os._exit(EXIT_ABORTED)


@contextmanager
def stop_on_signals(announce_abort: bool = True) -> Iterator[None]:
    """In the main thread: a stop signal requests a clean stop, a second Ctrl-C exits (saying so: `announce_abort`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        try:
            record_stop(signum)
        except Abort:
            abort(announce_abort)

    with stop_handlers(handle):
        yield


@contextmanager
def stop_handlers(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """`handler` for every stop signal and a fresh request state; the previous handlers back after."""
    global _requested, _first_ctrl_c, _saved
    # First: taking over from startup's handlers (and their request) puts back what they replaced, restored after.
    _requested, _first_ctrl_c = startup.take_over(), None
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    previous |= {s: signal.getsignal(s) for s in submitit_requeue.signals()}  # feature: slurm (its signal in its jobs)
    submitit_requeue.take_handler(previous)  # feature: slurm
    for s in previous:
        signal.signal(s, handler)
    leaving_stopped = False
    try:
        yield
    except Stopped:  # in the parent of self-started DDP workers: the workers saved and stopped
        leaving_stopped = True
        submitit_requeue.leave_requeued()  # feature: slurm
        raise
    finally:
        # The checkpoint is written: a late signal must not turn exit 75 into a silent death, so ignore them now.
        for s, old in previous.items():
            signal.signal(s, signal.SIG_IGN if leaving_stopped else old)
        _requested, _first_ctrl_c, _saved = None, None, False
        submitit_requeue.forget()  # feature: slurm


def stop_signal(device: torch.device, agree: bool) -> str | None:
    """The stop signal the run received, the same on every rank, or None. Under DDP: None unless `agree` (all ranks
    call it at the same update); then one all-reduce tells every rank (the highest signal number names it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return _requested
    if not agree:
        return None
    number = torch.tensor(float(signal.Signals[_requested]) if _requested else 0.0, device=device)
    dist.all_reduce(number, op=dist.ReduceOp.MAX)
    value = int(number.item())
    return signal.Signals(value).name if value else None


def stopped(name: str, run_dir: Path, epoch: int, step: int, is_main: bool, tested: bool = False) -> SystemExit:
    """Say in one line (rank 0) why the run stopped and how it continues (`tested`: after summary.json, nothing to
    resume); return Stopped or submitit's requeue exit. Ranks wait for rank 0 (srun --kill-on-bad-exit would end it)."""
    global _saved
    barrier()
    _saved = True  # every rank has its checkpoint: from here a second Ctrl-C no longer aborts
    leaving: SystemExit | None = None  # what exits in place of Stopped
    leaving = submitit_requeue.hand_over()  # feature: slurm (tested: requeued, its resume finds the run finished)
    if is_main:
        sweep = continue_command_instead()
        if tested:
            then = f"; continue the sweep with: {sweep}" if sweep else "; nothing is left to resume"
            written = f"{run_dir.resolve() / 'summary.json'} is written (exit code {EXIT_STOPPED})"
            how = f"after training to its end: its test finished and {written}{then}"
        else:
            checkpoints = run_dir.resolve() / "checkpoints"
            checkpoint = latest_checkpoint(checkpoints) or checkpoints / "last.pt"  # or a sharded last/
            command = sweep or f"python train.py {shlex.quote(f'resume={checkpoint}')}"  # pasted as it is
            how = f"checkpoint saved (exit code {EXIT_STOPPED}); continue with: {command}"
            how = submitit_requeue.requeued_line(checkpoint) if leaving else how  # feature: slurm
        log.warning(f"stopped by {name} at epoch {epoch}, step {step}, {how}")
    barrier()
    return leaving or Stopped()


def stop_after_the_test(run_dir: Path, epoch: int, step: int, device: torch.device, is_main: bool) -> None:
    """A stop signal that came in the last epoch or the test: now that summary.json is written, stop as any stop does
    (exit 75), so a multirun stops too. Every rank calls it after the test; without a signal it returns."""
    if name := stop_signal(device, agree=True):
        raise stopped(name, run_dir, epoch, step, is_main, tested=True)


def stop_if_requested_while_starting(agree_later: bool = False) -> None:
    """Stop before anything is built on a signal that came while starting (`agree_later`: at the first logging step)."""
    if _requested and not agree_later:
        raise stopped_before_training(_requested, "while starting")


def stopped_before_training(name: str, when: str) -> Stopped:
    """A stop before the first update: nothing is saved; one line says how to start again. The caller raises it."""
    global _saved
    _saved = True
    if process_info().is_main:
        log.warning(
            f"stopped by {name} {when}, before training: nothing trained or saved (exit code {EXIT_STOPPED}); "
            "start again with the same command (resume=auto starts afresh)"
        )
    return Stopped()


def continue_command_instead() -> str | None:
    """The command that continues more than this run, where one was named (CONTINUE_WITH_ENV), else None."""
    return os.environ.get(CONTINUE_WITH_ENV) or None
