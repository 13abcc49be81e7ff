"""Bad input: one line on stderr naming the key, exit code 1, no stack trace."""

import pytest


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data=nope"], ["data=nope", "digits"]),
        (["optimizer.lrr=0.1"], ["optimizer.lrr", "did you mean optimizer.lr"]),
        (["trainer.max_epochs=abc"], ["trainer.max_epochs", "whole number"]),
        (["optimizer.lr=0"], ["optimizer.lr", "> 0"]),
        (["data.batch_size=-4"], ["data.batch_size", ">= 1"]),
        (["data=imagefolder", "data.root=/no/such/folder"], ["data.root", "/no/such/folder"]),
        (["data=mnist", "data.root=/no/such/folder"], ["data.root", "data.download=true"]),
        (["model=timm", "model.name=resnet1000"], ["model.name", "resnet1000", "did you mean"]),
        (["model=torchvision", "model.name=resnet1000"], ["model.name", "resnet1000"]),
    ],
)
def test_bad_input_gives_one_clear_line(run_train, overrides, expected):
    run = run_train(*overrides, check=False)
    assert run.returncode == 1
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
