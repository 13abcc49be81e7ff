"""Under submitit (Hydra's submitit launchers, e.g. hydra/launcher=slurm), a stop on submitit's signal requeues the job.

submitit warns of a timeout or a preemption with its own signal, SIGUSR2 (env SUBMITIT_PREEMPT_SIGNAL), whose
handler would requeue the job and exit at once, wherever training is. Here that signal is one more stop request
(trainkit.checkpointing.signals calls this module from lines it marks as the slurm feature's): the run stops after
the update, saves, and only then calls submitit's handler (`hand_over`): on the job's first task it requeues the
job (submitit's `checkpoint()`: the same job again) and exits (144 local, -1 on SLURM), and the requeued job
continues from last.pt with resume=auto. Other tasks exit 75. SIGTERM stays a plain stop (scancel, or SLURM's own
preemption notice: SLURM requeues with PreemptMode=REQUEUE, the job does not).
"""

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

log = logging.getLogger("train")

# submitit's signal before a timeout or on a preemption (submitit.JobEnvironment.USR_SIG): USR2 unless
# SUBMITIT_PREEMPT_SIGNAL says otherwise, at submission already (it becomes sbatch's --signal).
SUBMITIT_SIGNAL: signal.Signals | None = getattr(
    signal, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}", None
)
SIGNAL_NAMES = (SUBMITIT_SIGNAL.name,) if SUBMITIT_SIGNAL else ()

_requeue: Callable[[int, FrameType | None], object] | None = None  # submitit's handler, while its signal is ours
_preempted = False  # submitit's signal came: hand over to its handler after the checkpoint


def submitit_signal() -> signal.Signals | None:
    """SUBMITIT_SIGNAL in a job started by submitit, else None."""
    return SUBMITIT_SIGNAL if os.environ.get("SUBMITIT_EXECUTOR") else None  # set in its jobs (and their workers)


def signals() -> tuple[signal.Signals, ...]:
    """submitit's signal in a job it started, to be handled as a stop signal; else none."""
    return tuple(filter(None, [submitit_signal()]))


def record(signum: int) -> None:
    """Note a stop request on submitit's signal: the stop then hands over to submitit's handler."""
    global _preempted
    _preempted = _preempted or signum == submitit_signal()


def take_handler(previous: dict) -> None:
    """Keep submitit's handler of its signal from `previous` (the handlers the stop handlers replace), to call
    once the checkpoint is written; a fresh state for this run."""
    global _requeue, _preempted
    submitits = previous.get(submitit_signal())
    _requeue = submitits if callable(submitits) else None  # not SIG_DFL in DDP workers that submitit did not start
    _preempted = False


def forget() -> None:
    """Drop the handler and the request, as the stop handlers end."""
    global _requeue, _preempted
    _requeue, _preempted = None, False


def hand_over() -> SystemExit | None:
    """After a clean stop on submitit's signal, once the checkpoint is written: call submitit's handler, as the signal
    would have. On the job's first task it requeues the job and exits (the SystemExit to raise, returned); on the other
    tasks it does nothing. Once a process; None without submitit's signal, or when submitit declines to requeue (timed
    out too many times): then one line says so and the run exits 75 like any stop."""
    global _requeue
    requeue, _requeue = _requeue, None
    if requeue is None or not _preempted:
        return None
    try:
        requeue(submitit_signal() or 0, None)
    except SystemExit as leaving:  # requeued: submitit's exit code (144 local, -1 SLURM)
        return leaving
    except Exception as error:  # submitit.core.utils.UncompletedJobError, e.g. timed out too many times
        log.warning(f"not requeued: {error}")  # the stop line that follows says how the run continues
    return None


def leave_requeued() -> None:
    """In the parent of self-started DDP workers whose stop (Stopped) is being raised: where submitit requeues
    the job, leave with its exit instead, saying so."""
    leaving = hand_over()
    if leaving is not None:
        log.warning("submitit requeued the job: it continues from checkpoints/last.pt with resume=auto")
        raise leaving from None


def requeued_line(checkpoint: Path) -> str:
    """The stop line's ending where submitit requeued the job."""
    return f"checkpoint saved; submitit requeued the job: it continues from {checkpoint} with resume=auto"
