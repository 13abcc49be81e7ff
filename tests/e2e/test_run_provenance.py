"""Every run records where it came from: provenance.json, packages.txt and, for a dirty tree,
code.diff (trainkit.tracking.provenance; its details are tested in tests/unit/tracking); the start line shows its
facts. Each tracker's test shows that the tracker keeps them (test_mlflow_runs.py, test_tensorboard_runs.py,
test_wandb_runs.py), so that this file imports no tracker's package."""

import json

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.progress_bar=false", "print_config=false")


def test_the_default_run_writes_provenance_and_names_its_commit(run_train):
    run = run_train(*QUICK, "trainer.deterministic=true")
    facts = json.loads((run.run_dir / "provenance.json").read_text())
    assert facts["overrides"] == [*QUICK, "trainer.deterministic=true"]
    assert (facts["world_size"], facts["seed"], facts["device"], facts["deterministic"]) == (1, 0, "cpu", True)
    assert (run.run_dir / "packages.txt").is_file()
    train_log = (run.run_dir / "train.log").read_text()
    if facts["code"] is not None:  # a git checkout (a copy without .git has no commit to name)
        assert f"(code {facts['code']}) -> {run.run_dir}" in train_log
        assert (run.run_dir / "code.diff").exists() == facts["git"]["dirty"]
