"""Bad input: one line on stderr naming the key, exit code 1, no stack trace."""

import pytest

from conftest import ROOT
from helpers import needs_downloads, needs_image_folders, nothing_left

LOGGERS = ", ".join(sorted(path.stem for path in (ROOT / "conf" / "logger").glob("*.yaml")))  # none and the trackers


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data=nope"], ["data=nope", "digits"]),
        (["logger=[none,nonee]"], [f"logger=nonee: no such option; choose one of {LOGGERS}"]),
        (["optimizer.lrr=0.1"], ["optimizer.lrr", "did you mean optimizer.lr"]),
        # The schema's mistakes, found in one pass: one run shows all three on the one line.
        (
            ["trainer.max_epochs=abc", "optimizer.lr=0", "data.batch_size=-4"],
            ["trainer.max_epochs", "whole number", "optimizer.lr", "> 0", "data.batch_size", ">= 1"],
        ),
        pytest.param(
            ["data=imagefolder", "data.root=/no/such/folder"],
            ["data.root", "/no/such/folder"],
            marks=needs_image_folders,
        ),
        pytest.param(
            ["data=mnist", "data.root=/no/such/folder"], ["data.root", "data.download=true"], marks=needs_downloads
        ),
        (["trainer.max_epochs=-1"], ["trainer.max_epochs", ">= 1"]),
    ],
)
def test_bad_input_gives_one_clear_line(run_train, overrides, expected):
    run = run_train(*overrides, check=False)
    assert run.returncode == 1
    assert nothing_left(run.run_dir, nor_beside=True)  # refused before any work: Hydra's directory is gone
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, run.stderr
    assert "Error executing job" not in run.stderr  # Hydra's own extra line is not added
    for fragment in expected:
        assert fragment in lines[0], (fragment, lines[0])


def test_full_error_env_shows_the_trace(run_train, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    run = run_train("optimizer.lr=0", check=False)
    assert run.returncode == 1 and "Traceback" in run.stderr and "ConfigError" in run.stderr
