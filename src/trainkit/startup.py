"""A stop signal while train.py starts: `install()`, in the script's first lines, before torch and Hydra import
(seconds, in which Python's defaults answer a Ctrl-C with a traceback from deep inside an import and a SIGTERM with a
silent death). It gives each stop signal nothing handles yet (an ignored one, as `nohup` leaves it, stays ignored) a
handler that only records the request; the run's handlers (trainkit.checkpointing.signals) `take_over` it and stop
before training: one line, exit 75. A second signal while starting (not the echo of the first, which torchrun's agent
sends within a second) ends the process at once, in one line, exit 75 too. Stdlib only, so that `--help` stays fast."""

import os
import signal
import sys
import time
from types import FrameType

# Here, not in trainkit.checkpointing.signals (which imports them from here), since that module imports torch.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
EXIT_STOPPED = 75  # stopped by a signal, resumable (sysexits.h EX_TEMPFAIL)
SAME_CTRL_C_SECONDS = 1.0

_requested: str | None = None
_first_at: float | None = None
_originals: dict[signal.Signals, object] = {}  # the handlers before this module's, put back by `done`


def _record(signum: int, frame: FrameType | None) -> None:
    global _requested, _first_at
    now = time.monotonic()
    if _first_at is not None and now - _first_at > SAME_CTRL_C_SECONDS:
        stopped = f"stopped by {_requested} while starting, before training: nothing trained or saved"
        print(f"{stopped} (exit code {EXIT_STOPPED}); start again with the same command", file=sys.stderr, flush=True)
        os._exit(EXIT_STOPPED)
    _requested, _first_at = _requested or signal.Signals(signum).name, _first_at or now


def take_over() -> str | None:
    """The stop signal received while starting (e.g. "SIGINT"), or None; the run's handlers answer the signals now."""
    global _requested
    requested, _requested = _requested, None
    done()
    return requested


def done() -> None:
    """Put the handlers this module replaced back (the script is ending, or the run's handlers take over)."""
    for signum, handler in _originals.items():
        if signal.getsignal(signum) is _record:
            signal.signal(signum, handler)  # type: ignore[arg-type]
    _originals.clear()


def install() -> None:
    """Record the stop signals that nothing handles yet, until the run's handlers `take_over`."""
    global _requested, _first_at
    _requested, _first_at = None, None  # a new start (a test may run train.py's entry several times in one process)
    try:
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_DFL, signal.default_int_handler):  # nobody handles it yet
                _originals[signum] = handler
                signal.signal(signum, _record)
    except ValueError:  # not the main thread: signal handlers belong to the main thread
        _originals.clear()
