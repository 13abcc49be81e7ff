"""What a run records of its data, read back by a resume: the fold it validates on
(its start line and summary.json), and the identity of the data it read before any split (summary.json's "data":
its files, their contents, its classes), the same for every fold and split seed of one dataset."""

import json
import re

import pytest

from helpers import hashes_of_every_file, needs_folds, template_has, unchanged_but_the_record

QUICK = ("trainer.max_epochs=1", "trainer.progress_bar=false", "print_config=false")


@needs_folds
def test_every_run_under_folds_names_its_fold_in_the_start_line_and_summary_json(run_train):
    run = run_train(*QUICK, "data.folds=3", "data.fold=1")
    start = next(line for line in (run.stderr + run.stdout).splitlines() if "training " in line and " -> " in line)
    assert re.search(
        r"training [\d,]+ parameters on \S+ for 1 epoch \(\d+ updates\), val fold 1 of 3 \(data\.folds\)", start
    )
    assert run.summary["fold"] == "fold 1 of 3"
    plain = run_train(*QUICK)
    assert "fold" not in plain.summary and " val fold " not in plain.stderr + plain.stdout


def reviews(path, last_word: str) -> None:
    """80 rows of two classes; `last_word` (4 letters) ends every text: the same size and labels, other words."""
    rows = [{"text": ("great " if k % 2 else "awful ") * (1 + k % 7) + last_word, "label": k % 2} for k in range(80)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for row in rows))


@pytest.mark.skipif(not template_has("data/hf.yaml"), reason="this clone has no data=hf (trimmed)")
def test_two_hf_runs_on_files_of_one_name_and_size_with_other_words_are_other_data(run_train, tmp_path, monkeypatch):
    """Their summary.json's data differs in the files' digests alone, and a resume of one with the other's file is
    refused in one line that leaves the run directory as it was."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    first, second = tmp_path / "a" / "reviews.jsonl", tmp_path / "b" / "reviews.jsonl"
    reviews(first, "fine")
    reviews(second, "okay")
    common = (*QUICK, "data=hf", "model=sequence", "data.num_workers=0", "data.max_length=16",
              f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    a, b = run_train(*common, f"data.path={first}"), run_train(*common, f"data.path={second}")
    assert a.summary["data"]["files"]["reviews.jsonl"]["bytes"] == b.summary["data"]["files"]["reviews.jsonl"]["bytes"]
    digests = [
        b.summary["data"]["files"]["reviews.jsonl"]["sha256"][:12],
        a.summary["data"]["files"]["reviews.jsonl"]["sha256"][:12],
    ]
    contents = f"the contents of reviews.jsonl differ (the same name and size; sha256 {digests[0]}, was {digests[1]})"

    before = hashes_of_every_file(a.run_dir)
    resumed = run_train(
        f"resume={a.run_dir}", "trainer.max_epochs=2", f"data.path={second}", check=False, run_dir=a.run_dir
    )
    assert resumed.returncode == 1
    assert resumed.stderr.strip().splitlines()[-1] == (
        f"error: data: {contents} "
        "since the checkpoint: the resumed run would train and test on other splits; resume with the data the run "
        "trained on, or start a new run"
    )
    assert unchanged_but_the_record(a.run_dir, before)
