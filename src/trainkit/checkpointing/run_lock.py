"""One process group owns a run directory at a time (two would both append to metrics.jsonl and write last.pt): it holds
an flock on `<run dir>/.lock`, with its PID and host written there for the one line a second run gets. The kernel drops
an flock when its holder exits, even killed, so no lock is left stuck. The file stays: deleting it would let a third
run lock a new file while the second still held the old one."""

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from trainkit.errors import ConfigError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def own_run_directory(run_dir: Path, key: str) -> Iterator[None]:
    """Hold `run_dir`'s lock while the block runs; raise ConfigError naming `key` (the config key that
    chose the directory) and the holder when another run holds it. Never waits."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as lock:  # "a+": created if missing, never emptied before it is ours
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"  # empty for the moment between its flock and write
            raise ConfigError(
                key,
                f"{run_dir} is in use by {holder} (it holds {run_dir / LOCK_FILE}): another run trains there now; "
                f"wait for it to end or stop it, then resume",
            ) from None
        lock.truncate(0)  # "a+" writes at the end: now its start
        lock.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield
