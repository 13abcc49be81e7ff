"""End to end: a refused resume leaves every file of its run as it was (trainkit.checkpointing.refusal); the same
for a refusal in DDP workers is a case of tests/e2e/test_resume_changes.py."""

from helpers import hashes_of_every_file


def test_a_refused_resume_leaves_every_file_of_the_run_as_it_was(run_train):
    """Refused once the data is built (after .hydra/, .lock, provenance.json and metrics.jsonl were rewritten):
    .hydra/ must not hold the refused settings for scripts/rerun.py and compare_runs.py to replay."""
    first = run_train("debug=fast")
    before = hashes_of_every_file(first.run_dir)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".lock", "metrics.jsonl", "train.log"} <= set(before)
    for resume in (f"resume={first.run_dir}", "resume=auto"):
        refused = run_train(resume, "trainer.max_epochs=3", "data.split_seed=5", run_dir=first.run_dir, check=False)
        assert refused.returncode == 1 and refused.stderr.startswith("error: data: "), refused.stderr
        assert hashes_of_every_file(first.run_dir) == before, resume  # no provenance_parts/ either
