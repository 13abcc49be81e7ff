"""What a run records of its data, read back by scripts/compare_runs.py and a resume: the fold it validates on
(its start line and summary.json), and the identity of the data it read before any split (summary.json's "data":
its files, their contents, its classes), the same for every fold and split seed of one dataset."""

import re

QUICK = ("trainer.max_epochs=1", "trainer.progress_bar=false", "print_config=false")


def test_every_run_under_folds_names_its_fold_in_the_start_line_and_summary_json(run_train):
    run = run_train(*QUICK, "data.folds=3", "data.fold=1")
    start = next(line for line in (run.stderr + run.stdout).splitlines() if "training " in line and " -> " in line)
    assert re.search(
        r"training [\d,]+ parameters on \S+ for 1 epoch \(\d+ updates\), val fold 1 of 3 \(data\.folds\)", start
    )
    assert run.summary["fold"] == "fold 1 of 3"
    plain = run_train(*QUICK)
    assert "fold" not in plain.summary and " val fold " not in plain.stderr + plain.stdout
