"""scripts/rerun.py: a run again from its run directory alone (commit, code.diff, overrides)."""

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, run_here

TINY = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1")


def test_dry_run_prints_checkout_patch_and_train_with_the_recorded_overrides(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    commit = "0123456789abcdef0123456789abcdef01234567"
    facts = {"git": {"commit": commit, "untracked": ["notes.py"]}, "packages": {"omegaconf": "0.0.1"}}
    (run_dir / "provenance.json").write_text(json.dumps(facts))
    (run_dir / "code.diff").write_text("# untracked, not in the diff below: notes.py\ndiff --git a/x b/x\n")
    OmegaConf.save(OmegaConf.create(["optimizer.lr=0.05", f"resume={run_dir}"]), run_dir / ".hydra" / "overrides.yaml")
    code, out, err = run_here("scripts/rerun.py", str(run_dir), "trainer.max_epochs=3", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert "untracked files that code.diff does not hold: notes.py" in lines[0]
    assert lines[1].startswith("rerun: installed versions differ from the run's: omegaconf ")
    assert lines[1].endswith("(run: 0.0.1)")
    assert lines[2].startswith(f"git -C {ROOT} worktree add --detach") and lines[2].endswith(commit)
    assert " apply --binary " in lines[3] and lines[3].endswith(str(run_dir / "code.diff"))
    train = lines[4].split()
    assert train[0].startswith("PYTHONPATH=") and train[0].split("=", 1)[1].split(":")[0].endswith("/tree/src")
    assert train[2].endswith("/tree/train.py") and train[3] == "optimizer.lr=0.05"  # resume= left out
    assert train[4].startswith("hydra.run.dir=") and train[5] == "trainer.max_epochs=3"  # appended, last
    assert "worktree remove" in lines[5] and len(lines) == 6


def test_rerun_without_provenance_is_one_line(tmp_path):
    code, _, err = run_here("scripts/rerun.py", str(tmp_path))
    assert code == 1 and err.strip().splitlines() == [
        f"error: {tmp_path / 'provenance.json'} not found: give a run directory that train.py wrote (it writes "
        "provenance.json)"
    ]


@pytest.mark.slow
def test_a_rerun_gives_the_same_test_accuracy(run_train, tmp_path):
    first = run_train(*TINY)
    if json.loads((first.run_dir / "provenance.json").read_text())["git"] is None:
        pytest.skip("the project is not a git checkout here: nothing to check out")
    again = tmp_path / "again"
    command = [sys.executable, str(ROOT / "scripts" / "rerun.py"), str(first.run_dir), f"hydra.run.dir={again}"]
    process = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    summary = json.loads((again / "summary.json").read_text())
    assert summary["test"]["test/acc"] == first.summary["test"]["test/acc"]
    assert OmegaConf.load(again / ".hydra" / "overrides.yaml")[: len(TINY)] == list(TINY)
