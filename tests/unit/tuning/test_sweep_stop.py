"""SIGTERM to a parallel sweep's launching process stops the whole sweep: every running job saves, exit 75."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from trainkit.tuning.sweep_stop import _alive, worker_processes


@pytest.mark.slow  # a sweep of worker processes
def test_sigterm_to_a_joblib_sweep_stops_every_job_with_a_checkpoint(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "trainer.max_epochs=500",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "data.batch_size=8",
        "print_config=false",
        "trainer.progress_bar=false",
        "seed=1,2,3",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    sweep = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints = [sweep_dir / job / "checkpoints" / "last.pt" for job in ("0", "1")]
    deadline = time.monotonic() + 120
    while not all(c.is_file() for c in checkpoints) and time.monotonic() < deadline and sweep.poll() is None:
        time.sleep(0.2)
    workers = worker_processes(sweep.pid)
    assert len(workers) == 2, workers  # the two loky workers (the resource trackers ignore SIGTERM)
    sweep.send_signal(signal.SIGTERM)
    output, _ = sweep.communicate(timeout=120)
    assert sweep.returncode == 75, output[-3000:]
    assert not any(_alive(pid) for pid in workers)  # no worker trains on
    # What continues the sweep, where a feature names it (sweep continuation: tests/e2e/test_sweep_resume.py).
    assert "sweep stopped by SIGTERM: the running jobs saved their checkpoints (exit code 75)" in output
    for job in ("0", "1"):  # each running job stopped at an update and saved there
        assert "stopped by SIGTERM at epoch" in (sweep_dir / job / "train.log").read_text()


def test_only_joblib_workers_are_stopped_not_the_other_children_of_the_launching_process():
    # The W&B service an earlier job of the basic launcher started is a child too: its later jobs log through it.
    service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "joblib.externals.loky"])
    try:
        deadline = time.monotonic() + 20  # until both have exec'd: their own command lines are in /proc
        while time.monotonic() < deadline and any(
            b"sleep" not in Path(f"/proc/{child.pid}/cmdline").read_bytes() for child in (service, worker)
        ):
            time.sleep(0.05)
        assert worker_processes() == [worker.pid]
    finally:
        for child in (service, worker):
            child.kill()
            child.wait()
