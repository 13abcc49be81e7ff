"""Sweep continuation's own check and the command it names for the stop lines (its end to end test, a stopped
sweep rerun: tests/e2e/test_sweep_resume.py)."""

from helpers import assert_one_config_error
from trainkit.checkpointing import signals, sweep_continuation


def test_sweep_continue_jobs_is_checked_beside_its_code():
    assert_one_config_error(["sweep.continue_jobs=sometimes"], "sweep.continue_jobs")


def test_the_launching_process_names_the_sweeps_rerun_where_its_directory_is_given(monkeypatch, tmp_path):
    for name in (sweep_continuation.SWEEP_ARGV, signals.CONTINUE_WITH_ENV):
        monkeypatch.setenv(name, "")  # as if unset; the test's environment is put back afterwards
    sweep_continuation.remember_sweep_command(["/code/train.py", "seed=1"])  # not a multirun
    assert signals.continue_command_instead() is None
    sweep_continuation.remember_sweep_command(["/code/train.py", "-m", "seed=1,2"])  # a time-named sweep directory
    assert signals.continue_command_instead() is None
    sweep_continuation.remember_sweep_command(["/code/train.py", "-m", f"hydra.sweep.dir={tmp_path}", "seed=1,2"])
    assert signals.continue_command_instead() == f"python train.py -m seed=1,2 hydra.sweep.dir={tmp_path.resolve()}"
