"""A multirun that resumes: the same command with the same hydra.sweep.dir continues a stopped sweep."""

import json

import pytest

from conftest import run_here
from helpers import hashes_of_every_file, sigterm_in_job, unchanged_but_the_record

SWEEP = ("debug=fast", "trainer.max_epochs=1", "data.batch_size=8", "print_config=false", "seed=1,2,3")


@pytest.fixture
def sigterm_in_job_1(monkeypatch):
    """Job 1 receives SIGTERM at its first update, as a preempted sweep would: it saves and stops the sweep."""
    sigterm_in_job(monkeypatch, 1)
    return monkeypatch


def files_of(job) -> dict:
    return {
        p.name: (p.stat().st_mtime_ns, p.read_bytes())
        for p in [*job.glob("checkpoints/*.pt"), job / "summary.json", job / "metrics.jsonl"]
    }


def test_rerunning_a_stopped_sweep_continues_it(tmp_path, sigterm_in_job_1):
    sweep_dir = tmp_path / "sweep"
    command = ("-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}")
    code, out, err = run_here("train.py", *command)
    assert code == 75, err[-3000:]
    assert (sweep_dir / "0" / "summary.json").is_file() and not (sweep_dir / "1" / "summary.json").exists()
    assert (sweep_dir / "1" / "checkpoints" / "last.pt").is_file() and not (sweep_dir / "2").exists()
    # The stop line continues the sweep, not one job of it.
    stop_line = next(line for line in (out + err).splitlines() if "stopped by SIGTERM" in line)
    assert stop_line.endswith(f"continue with: python train.py {' '.join(command)}"), stop_line
    first_job = files_of(sweep_dir / "0")

    sigterm_in_job_1.undo()
    code, _, err = run_here("train.py", *command)  # the same command again
    assert code == 0, err[-3000:]
    assert files_of(sweep_dir / "0") == first_job  # finished: not trained again, its files untouched
    assert "resuming" in (sweep_dir / "1" / "train.log").read_text()  # continued from its last.pt ...
    assert [json.loads(line)["step"] for line in (sweep_dir / "1" / "metrics.jsonl").read_text().splitlines()][-1] == 3
    summaries = [json.loads((sweep_dir / str(job) / "summary.json").read_text()) for job in range(3)]
    assert [s["steps"] for s in summaries] == [3, 3, 3]  # ... and the new job ran

    # Job numbers must mean the same trials: another grid in the same directory is one line, before any training,
    # and the refused job's directory keeps every file as it was (its .hydra/ does not say seed=7).
    refused_job = hashes_of_every_file(sweep_dir / "2")
    code, _, err = run_here("train.py", *command[:-2], "seed=1,2,7", command[-1])
    assert code == 1 and "error: hydra.sweep.dir:" in err and "(seed 3 -> 7)" in err, err[-2000:]
    assert unchanged_but_the_record(sweep_dir / "2", refused_job)
    code, _, err = run_here("train.py", *command, "sweep.continue_jobs=false")
    assert code == 1 and "error: sweep.continue_jobs: is false but" in err, err[-2000:]
