"""trainkit.checkpointing.refusal: what a refused call puts back, removes, and leaves alone."""

import os

import pytest

from trainkit.checkpointing import own_run_directory, refusal


def a_run(run_dir):
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"weights")
    (run_dir / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n')
    (run_dir / "train.log").write_text("first part\n")
    return run_dir


def refused_now(snapshot):
    refusal._this_job = snapshot
    refusal.undo_refused_call()


def test_a_refused_call_puts_the_record_back_and_removes_what_it_added(tmp_path, monkeypatch):
    run_dir = a_run(tmp_path / "run")
    monkeypatch.setattr(refusal, "KEPT_BYTES", 30)  # train.log (40 bytes) is kept by its length alone
    (run_dir / "train.log").write_text("a" * 40)
    snapshot = refusal.take_snapshot(run_dir)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 7\n")
    (run_dir / "metrics.jsonl").write_text('{"epoch": 0}\n')  # trimmed to the checkpoint: no work
    with open(run_dir / "train.log", "a") as log:
        log.write("the refused call's lines\n")
    (run_dir / "provenance_parts" / "1").mkdir(parents=True)
    (run_dir / "provenance_parts" / "1" / "provenance.json").write_text("{}")
    refused_now(snapshot)
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 1\n"
    assert (run_dir / "metrics.jsonl").read_text() == '{"epoch": 0}\n{"epoch": 1}\n'
    assert (run_dir / "train.log").read_text() == "a" * 40  # cut back to its old length
    assert not (run_dir / "provenance_parts").exists()
    assert refusal._this_job is None  # a second report undoes nothing


@pytest.mark.parametrize("work", ["checkpoint", "metric line"])
def test_a_call_that_did_work_keeps_its_record(tmp_path, work):
    run_dir = a_run(tmp_path / "run")
    snapshot = refusal.take_snapshot(run_dir)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 7\n")
    if work == "checkpoint":
        (run_dir / "checkpoints" / "best.pt").write_bytes(b"better weights")
    else:
        with open(run_dir / "metrics.jsonl", "a") as metrics:
            metrics.write('{"epoch": 2}\n')
    refused_now(snapshot)
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 7\n"


def test_a_directory_another_run_holds_is_left_to_it(tmp_path):
    run_dir = a_run(tmp_path / "run")
    snapshot = refusal.take_snapshot(run_dir)
    with own_run_directory(run_dir, key="resume"):  # as a run training there now holds it
        (run_dir / "config_tree.txt").write_text("its tree")
        refused_now(snapshot)
    assert (run_dir / "config_tree.txt").read_text() == "its tree"


def test_a_directory_the_call_made_goes_with_the_folders_it_made(tmp_path):
    run_dir = tmp_path / "outputs" / "runs" / "now"
    snapshot = refusal.take_snapshot(run_dir)
    assert not snapshot.existed and snapshot.created_from == tmp_path
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "train.log").write_text("")
    refused_now(snapshot)
    assert list(tmp_path.iterdir()) == []


def test_a_new_looking_directory_holding_older_files_is_not_removed(tmp_path):
    run_dir = tmp_path / "run"
    snapshot = refusal.take_snapshot(run_dir)
    (run_dir / "notes.txt").parent.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    os.utime(run_dir / "notes.txt", (snapshot.taken_at - 3600, snapshot.taken_at - 3600))
    refused_now(snapshot)
    assert (run_dir / "notes.txt").read_text() == "mine"
