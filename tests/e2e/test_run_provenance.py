"""Every run records where it came from: provenance.json, packages.txt and, for a dirty tree,
code.diff (trainkit.tracking.provenance; its details are tested in tests/unit/tracking)."""

import json

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.progress_bar=false", "print_config=false")


def test_the_default_run_writes_provenance_and_names_its_commit(run_train):
    run = run_train(*QUICK)
    facts = json.loads((run.run_dir / "provenance.json").read_text())
    assert facts["overrides"] == list(QUICK)
    assert (facts["world_size"], facts["seed"], facts["device"], facts["deterministic"]) == (1, 0, "cpu", False)
    assert (run.run_dir / "packages.txt").is_file()
    train_log = (run.run_dir / "train.log").read_text()
    if facts["code"] is not None:  # a git checkout (a copy without .git has no commit to name)
        assert f"(code {facts['code']}) -> {run.run_dir}" in train_log
        assert (run.run_dir / "code.diff").exists() == facts["git"]["dirty"]
