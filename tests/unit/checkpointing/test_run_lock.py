"""trainkit.checkpointing.run_lock: one run a directory, and no lock left stuck by a killed owner."""

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import ROOT
from trainkit.checkpointing.run_lock import own_run_directory
from trainkit.errors import ConfigError

HOLD = (
    "import sys, time; from pathlib import Path; from trainkit.checkpointing.run_lock import own_run_directory\n"
    "with own_run_directory(Path(sys.argv[1]), key='resume'):\n    print('held', flush=True); time.sleep(60)"
)


def test_a_second_owner_is_refused_and_a_killed_owner_leaves_no_stuck_lock(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "held\n"
        in_use = "^" + re.escape(
            f"hydra.run.dir: {tmp_path} is in use by process {owner.pid} on {socket.gethostname()} "
        )
        with pytest.raises(ConfigError, match=in_use), own_run_directory(tmp_path, key="hydra.run.dir"):
            pass
    finally:
        owner.send_signal(signal.SIGKILL)  # as the OOM killer or a preemption would: no cleanup runs
        owner.wait()
    with own_run_directory(tmp_path, key="resume"):  # the kernel released the dead owner's lock: no error
        assert (tmp_path / ".lock").read_text() == f"process {os.getpid()} on {socket.gethostname()}\n"
