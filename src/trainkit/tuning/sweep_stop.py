"""Stop a whole multirun on SIGTERM, SIGINT or SIGHUP: every running job saves, the sweep exits 75.

A sweep's jobs run in the launching process (the basic launcher: the job's own handlers of
trainkit.checkpointing.signals stop it) or in worker processes (hydra/launcher=joblib: loky workers, children of the
launching process). Without this, SIGTERM to the launching process (scancel, kill, a closed terminal) ended it at once
with exit 143 and the workers trained on, unsupervised.

Here the launching process, on a stop signal, passes SIGTERM on to its worker processes (the children that do not ignore
SIGTERM: loky's resource trackers do, and stay), waits until they have exited (a worker running a job saves
checkpoints/last.pt at its next update and exits 75; an idle one exits at once), then prints one line with the command
that continues the sweep (trainkit.checkpointing.sweep_continuation) and exits 75. A second Ctrl-C kills the workers and
exits 130 without waiting. Jobs that had not started are started by the rerun. Linux only (the children are read from
/proc); elsewhere the signal ends the launching process as before: stop the workers too (`kill -TERM -<process group>`),
then rerun the sweep.
"""

import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from trainkit.checkpointing.resume import is_multirun
from trainkit.checkpointing.signals import EXIT_ABORTED, EXIT_STOPPED, Stopped, continue_command_instead

log = logging.getLogger("sweep")
SWEEP_PID = "TRAINKIT_SWEEP_PID"  # the launching process: a job elsewhere runs in a worker
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def worker_processes(parent: int | None = None) -> list[int]:
    """The live joblib (loky) workers of `parent` (this process) that take SIGTERM, read from /proc ([] elsewhere).
    Other children are left alone: the W&B service an earlier job of the basic launcher started (its
    later jobs log through it), and loky's resource tracker, which ignores SIGTERM."""
    parent = os.getpid() if parent is None else parent
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, ...
            ignored = next(
                line for line in (stat.parent / "status").read_text().splitlines() if line.startswith("SigIgn:")
            )
        except (OSError, IndexError, StopIteration):
            continue  # gone meanwhile
        takes_sigterm = not int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1))
        if int(fields[1]) == parent and fields[0] != "Z" and takes_sigterm and _is_loky_worker(stat.parent):
            children.append(int(stat.parent.name))
    return children


def _is_loky_worker(process: Path) -> bool:
    try:
        return b"loky" in (process / "cmdline").read_bytes()  # python -m joblib.externals.loky.backend.popen_loky_posix
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def stop_the_whole_sweep(
    argv: list[str], sweep_command: Callable[[], str | None] = continue_command_instead
) -> Iterator[None]:
    """Within (or around a function it decorates), where `argv` starts a multirun (not under SLURM's launcher, whose
    jobs are SLURM's): SIGTERM, SIGINT or SIGHUP stops every job, then the sweep (exit 75). `sweep_command`: what
    continues the sweep (where a feature names it), asked when the line is printed. Elsewhere it changes nothing."""
    slurm = any("launcher=slurm" in arg or "submitit" in arg for arg in argv)
    if not is_multirun(argv) or slurm or not Path("/proc/self/stat").exists():
        yield
        return
    os.environ[SWEEP_PID] = str(os.getpid())
    received: list[str] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signal.getsignal(signal.SIGTERM) is not stop:  # a job runs in this process and handles SIGTERM (not
            os.kill(os.getpid(), signal.SIGTERM)  # SIGHUP): it saves and stops the sweep itself
            return
        workers = worker_processes()
        if received and signum == signal.SIGINT:  # a second Ctrl-C: do not wait for the checkpoints
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            print("sweep aborted by a second Ctrl-C; each job's checkpoints/last.pt is as last saved", file=sys.stderr)
            os._exit(EXIT_ABORTED)
        if received:
            return  # the first request is being served
        received.append(name)
        if not workers:  # the basic launcher, between two jobs: nothing runs
            log.warning(f"sweep stopped by {name} between two jobs (exit code {EXIT_STOPPED})")
            raise Stopped()
        log.warning(f"sweep: {name}: stopping the {len(workers)} worker processes; each running job saves first")
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        while any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        command = sweep_command()
        rerun = f"; continue with: {command}" if command else ""
        log.warning(
            f"sweep stopped by {name}: the running jobs saved their checkpoints (exit code {EXIT_STOPPED}){rerun}"
        )
        raise Stopped()  # out of joblib's wait for the workers, which are gone: the sweep exits 75

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.environ.pop(SWEEP_PID, None)


def leaving_worker_after_a_stop(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`task` (cli.report_config_errors' Hydra task), which in a sweep's worker process, after its job stopped cleanly
    on a signal, exits the process (75), so the launching process, which waits for its workers, knows the checkpoint
    is written. In the launching process itself (the basic launcher) the stop ends the sweep as usual."""

    @functools.wraps(task)
    def leaving(cfg: Any) -> Any:
        try:
            return task(cfg)
        except Stopped:
            if os.environ.get(SWEEP_PID) not in (None, str(os.getpid())) and not os.environ.get("SUBMITIT_EXECUTOR"):
                for handler in logging.getLogger().handlers:
                    handler.flush()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_STOPPED)
            raise

    return leaving
