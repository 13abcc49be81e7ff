"""Text classification end to end: experiment=stdlib_functions's recipe (model=sequence, AdamW, batches by a token
budget) on data=textfolder, a tiny corpus of three classes made here, and on its own data, the standard library's
functions. train.py trains it and logs tokens and padding; eval.py gives summary.json's test metrics and names each
.txt file's class; two DDP ranks train as many batches each and test exactly; a SIGTERM inside an epoch resumes
exactly; bf16 and a multirun run on it; what cannot work on text is refused in one line."""

import csv
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, composed, run_here
from helpers import (
    assert_same_training,
    has_predict,
    hashes_of_every_file,
    needs_predict,
    nothing_left,
    template_has,
    unchanged_but_the_record,
)
from trainkit.checkpointing import save_checkpoint
from trainkit.config import to_dict
from trainkit.data import build_data, make_data
from trainkit.data.size_budget import SizeBudgetBatches
from trainkit.models import build_model

# Each class a byte pattern of its own, repeated to lengths of 3 to 90 bytes: learnable in a few updates.
PATTERNS = {"letters": "abc ", "digits": "123 ", "marks": "!?. "}

TINY_MODEL = ("model.width=16", "model.depth=1", "model.heads=2", "model.feedforward=32")
TINY = (
    "experiment=stdlib_functions",
    "data=textfolder",
    "data.num_workers=0",  # 135 small files: reading them in this process is quicker than starting a worker
    "data.max_length=64",  # some files are longer: cut
    "data.max_tokens=256",
    "data.batch_size=16",
    "data.val_fraction=0.2",
    "data.test_fraction=0.2",
    *TINY_MODEL,
    "optimizer.lr=1e-2",
    "trainer.max_epochs=2",
    "trainer.progress_bar=false",
    "print_config=false",
)


def write_texts(folder: Path, count: int, seed: int) -> Path:
    """`count` files a class in <folder>/<class>/, each its class's pattern cut to a random length."""
    generator = random.Random(seed)
    for name, pattern in PATTERNS.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for number in range(count):
            (folder / name / f"{number:02}.txt").write_text((pattern * 30)[: generator.randint(3, 90)])
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """train/<class>/*.txt, 45 files a class; val/ and test/ are carved from it."""
    root = tmp_path_factory.mktemp("texts")
    write_texts(root / "train", 45, seed=0)
    return root


def tiny(corpus: Path, *overrides: str) -> tuple[str, ...]:
    return (*TINY, f"data.root={corpus}", *overrides)


def test_a_text_folder_trains_by_a_token_budget_and_eval_py_tests_and_predicts_the_same(run_train, corpus, tmp_path):
    run = run_train(*tiny(corpus))
    assert run.summary["test"]["test/acc"] > 0.9  # the majority class is a third
    per_epoch = train_batches_an_epoch(corpus, world_size=1)
    assert [epoch["step"] for epoch in run.epoch_metrics()] == [per_epoch, 2 * per_epoch]  # the budget's batches
    for epoch in run.epoch_metrics():
        assert epoch["train/tokens_per_sec"] > 0
        # Length buckets pad ~5% here; batches of 16 texts of 3-64 bytes (data.max_tokens=null) pad ~34%.
        assert 0 <= epoch["train/padding_fraction"] < 0.15

    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'eval'}", f"checkpoint={run.run_dir}")
    assert code == 0, stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    for key in ("test/acc", "test/loss"):
        assert metrics[key] == pytest.approx(run.summary["test"][key], rel=1e-6), key
    if not has_predict:
        return

    # Files the run never saw, one in a sub-folder, and a file that is not text: a row for each .txt file.
    unseen = tmp_path / "unseen"
    for name, pattern in PATTERNS.items():
        (unseen / "more").mkdir(parents=True, exist_ok=True)
        (unseen / f"{name}.txt").write_text(pattern * 5)
        (unseen / "more" / f"{name}.txt").write_text(pattern * 12)
    (unseen / "notes.md").write_text("not a .txt file")
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={run.run_dir}",
                               f"predict={unseen}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    with (tmp_path / "out" / "predictions.csv").open() as f:
        rows = {row["file"]: row["class"] for row in csv.DictReader(f)}
    expected = {f"{folder}{name}.txt": name for name in PATTERNS for folder in ("", "more/")}
    # Relative to the folder given, the .md left out, named by the class folders; and right: the files are read
    # as training read them (byte b as token b + 1; as token b, the marks are called letters).
    assert rows == expected

    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'none'}", f"checkpoint={run.run_dir}",
                               f"predict={tmp_path / 'no_such_folder'}")  # fmt: skip
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and errors[0].startswith("error: predict: "), stderr[-3000:]
    assert "Traceback" not in stderr


def predicted_classes(run, tmp_path: Path) -> dict[str, str]:
    """eval.py predict= on a file of each class's pattern: {file: the class predicted}."""
    unseen = tmp_path / "unseen"
    unseen.mkdir()
    for name, pattern in PATTERNS.items():
        (unseen / f"{name}.txt").write_text(pattern * 5)
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={run.run_dir}",
                               f"predict={unseen}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    with (tmp_path / "out" / "predictions.csv").open() as f:
        return {row["file"]: row["class"] for row in csv.DictReader(f)}


@needs_predict
def test_eval_py_predicts_without_the_training_data(run_train, tmp_path):
    """The checkpoint keeps the class names (and the config its tokenization): data.root may be gone."""
    root = write_texts(tmp_path / "texts" / "train", 20, seed=4).parent
    run = run_train(*tiny(root, "trainer.max_epochs=1", "data.class_folders=[marks,letters,digits]"))
    shutil.move(root, tmp_path / "elsewhere")
    rows = predicted_classes(run, tmp_path)
    assert set(rows) == {f"{name}.txt" for name in PATTERNS} and set(rows.values()) <= set(PATTERNS)


@pytest.fixture(scope="module")
def untrained_run(corpus, tmp_path_factory) -> Path:
    """A run directory as train.py leaves it (.hydra/overrides.yaml, checkpoints/last.pt) of tiny(corpus), untrained."""
    run_dir = tmp_path_factory.mktemp("untrained") / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(list(tiny(corpus))), run_dir / ".hydra" / "overrides.yaml")
    # The run counts the class folders and fills in its tokenizer's ids and padding: as train.py leaves the config.
    config = to_dict(composed(*tiny(corpus), "data.num_classes=3", "data.vocabulary=257", "data.pad_id=0"))
    model = build_model(config["model"])
    state = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 0, "batches_done": 0}
    save_checkpoint(run_dir / "checkpoints" / "last.pt", {**state, "config": config})
    return run_dir


def test_eval_py_overrides_the_runs_own_keys_without_a_plus_and_refuses_a_group(untrained_run, tmp_path):
    code, stdout, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'cut'}", f"checkpoint={untrained_run}",
                                    "data.max_length=32")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert "are longer than data.max_length=32 bytes and are cut to it" in stdout  # the texts are cut at 32 ...
    evaluated = OmegaConf.load(tmp_path / "cut" / ".hydra" / "config.yaml")
    assert evaluated.data.max_length == 32 and evaluated.model.max_length == 64  # ... by the model of the checkpoint
    for group in ("data=textfolder", "model=cnn"):
        code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={untrained_run}", group)
        lines = stderr.strip().splitlines()
        name = group.split("=")[0]
        assert code == 1 and len(lines) == 1, stderr
        assert lines[0].startswith(f"error: {name}: eval.py evaluates the run's own config (its checkpoint's), so "
                                   f"{name}= cannot be chosen here; override the run's keys one by one")  # fmt: skip
        assert nothing_left(tmp_path / "out")


@needs_predict
def test_predict_counts_and_names_what_it_skips_and_honours_skip_bad_files(untrained_run, tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("abc abc")
    (folder / "sub" / "b.txt").write_text("123 123")  # sub-folders are read
    (folder / "latin1.txt").write_bytes(b"caf\xe9 abc")  # not UTF-8
    (folder / "x.py").write_text("print(1)")  # not a .txt file
    (folder / ".hidden.txt").write_text("abc")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD.txt").write_text("ref")  # inside a hidden folder: the folder is named, once
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={untrained_run}",
                               f"predict={folder}")  # fmt: skip
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith(f"error: predict: cannot read '{folder / 'latin1.txt'}' (UnicodeDecodeError: ")
    assert errors[0].endswith("; fix or remove it, or pass data.skip_bad_files=true to skip it")
    assert nothing_left(tmp_path / "out")  # nothing predicted: every file is read before the first prediction

    code, stdout, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={untrained_run}",
                                    f"predict={folder}", "data.skip_bad_files=true")  # fmt: skip
    assert code == 0, stderr[-3000:]
    with (tmp_path / "out" / "predictions.csv").open() as f:
        assert [row["file"] for row in csv.DictReader(f)] == ["a.txt", "sub/b.txt"]
    assert f"'{folder}': 3 file(s) not read (hidden, or not text files): .git, .hidden.txt, x.py" in stdout
    assert "skipped 1 unreadable file(s) (data.skip_bad_files=true): latin1.txt" in stdout
    assert "predictions for 2 text files" in stdout


@pytest.mark.slow  # ~20 s on 2 CPU cores: parsing the standard library, and a test split of ~800 functions, twice
def test_the_stdlib_functions_experiment_trains_and_eval_py_names_a_package(run_train, tmp_path):
    functions = ("experiment=stdlib_functions", "data.max_length=128", "data.max_tokens=2048")
    run = run_train(*functions, *TINY_MODEL, "trainer.max_epochs=1", "trainer.limit_train_batches=4",
                    "trainer.limit_val_batches=2", "trainer.progress_bar=false", "print_config=false")  # fmt: skip
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'eval'}", f"checkpoint={run.run_dir}")
    assert code == 0, stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)
    if not has_predict:
        return
    function = tmp_path / "function.txt"
    function.write_text("async def main():\n    await asyncio.sleep(1)\n")
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={run.run_dir}",
                               f"predict={function}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    with (tmp_path / "out" / "predictions.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    packages = make_data(OmegaConf.to_container(composed(*functions).data)).class_names()  # this Python's 8
    assert row["file"] == "function.txt" and row["class"] in packages  # a package's name, not a number


def test_bf16_runs_on_text(run_train, corpus):  # the LR finder on text: tests/e2e/test_lr_finder_runs.py
    run = run_train(*tiny(corpus, "trainer.max_epochs=1", "precision=bf16"))
    assert "test/acc" in run.summary["test"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.max_tokens=32"], "data.max_tokens"),  # below data.max_length=64: a long text would fit no batch
        (["augmentation=shift"], "augmentation"),  # image shifts on bytes
    ],
)
def test_what_cannot_work_on_text_is_refused_in_one_line_before_the_run_directory(run_train, corpus, overrides, key):
    run = run_train(*tiny(corpus, *overrides), check=False)
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}: "), run.stderr[-3000:]
    assert nothing_left(run.run_dir)  # refused by the config check, before any data or model


def test_a_text_folder_without_a_model_names_the_model_made_for_it(run_train, corpus):
    run = run_train("data=textfolder", f"data.root={corpus}", check=False)  # model=cnn, the default, reads images
    assert run.returncode == 1 and nothing_left(run.run_dir)
    assert run.stderr.strip().startswith(
        "error: model.in_channels: is ${data.channels}, but data=textfolder has no data.channels: model=cnn is made "
        "for other data; pick model=sequence"
    )
    # model=hf too, if kept; then the data options model=cnn reads (data=cached, data=imagefolder where kept)
    assert "(made for data=textfolder), or data=" in run.stderr and " or data=digits or " in run.stderr


def test_a_file_that_is_not_utf8_in_the_test_split_stops_the_run_before_training_unless_skipped(run_train, tmp_path):
    root = tmp_path / "texts"
    write_texts(root / "train", 20, seed=1)
    write_texts(root / "test", 3, seed=2)
    write_texts(root / "val", 3, seed=3)
    bad = root / "test" / "letters" / "cp1252.txt"  # read last, after every epoch, when it was found in the test
    bad.write_bytes("abc \u201cabc\u201d".encode("cp1252"))
    stopped = run_train(*tiny(root), check=False)
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert stopped.returncode == 1 and len(errors) == 1, stopped.stderr[-3000:]
    assert str(bad) in errors[0] and "data.skip_bad_files=true" in errors[0] and "Traceback" not in stopped.stderr
    assert "epoch   0" not in stopped.stdout + stopped.stderr and nothing_left(stopped.run_dir)  # before any update
    skipped = run_train(*tiny(root, "data.skip_bad_files=true"))
    log = skipped.stdout + skipped.stderr
    assert f"'{root / 'test'}': skipped 1 of 10 text files that are not UTF-8 (data.skip_bad_files=true)" in log
    assert "test split: majority class digits, 3 of 9 texts" in log and "test/acc" in skipped.summary["test"]


@pytest.mark.slow  # two runs, ~15 s on 2 CPU cores
def test_a_multirun_over_the_lr_finishes_both_jobs(corpus, tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, _, stderr = run_here("train.py", "-m", *tiny(corpus, "optimizer.lr=1e-3,3e-3"),
                               f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    summaries = [json.loads((sweep_dir / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert all("test/acc" in summary["test"] for summary in summaries)
    lrs = [OmegaConf.load(sweep_dir / str(job) / ".hydra" / "config.yaml").optimizer.lr for job in (0, 1)]
    assert lrs == [1e-3, 3e-3]  # each job trained with its own value


# ---- DDP and resume ----------------------------------------------------------------------------


def train_lengths(corpus: Path):
    """The tiny corpus's training texts' lengths, in tokens (as the token budget sees them)."""
    import torch

    cfg = composed(*tiny(corpus))
    return build_data(cfg.data, torch.device("cpu"), seed=0).train.loader.dataset.lengths


def train_batches_an_epoch(corpus: Path, world_size: int) -> int:
    """What SizeBudgetBatches gives each rank of the tiny corpus's train split an epoch."""
    cfg = composed(*tiny(corpus))
    return len(
        SizeBudgetBatches(train_lengths(corpus), cfg.data.max_tokens, cfg.data.batch_size, world_size=world_size)
    )


@pytest.mark.slow  # a 2-process run and an evaluation
def test_two_ranks_train_as_many_batches_each_and_test_as_one_process_does(run_train, corpus, tmp_path):
    two = ("distributed=ddp", "distributed.nproc_per_node=2", "regularization.early_stopping.enabled=false")
    run = run_train(*tiny(corpus, *two))
    assert run.summary["world_size"] == 2
    # A rank with a batch fewer would wait in the gradient all-reduce forever: the run finishing says they agree,
    # and the steps are the budget's count for one of two ranks.
    per_epoch = train_batches_an_epoch(corpus, world_size=2)
    assert per_epoch < train_batches_an_epoch(corpus, world_size=1)
    assert [epoch["step"] for epoch in run.epoch_metrics()] == [per_epoch, 2 * per_epoch]
    best = run.run_dir / "checkpoints" / "best.pt"
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'eval'}", f"checkpoint={best}")
    assert code == 0, stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)


@pytest.mark.skipif(not template_has("lr_finder"), reason="this clone has no LR finder (trimmed)")
def test_the_lr_finder_runs_on_text(run_train, corpus):
    run = run_train(*tiny(corpus, "trainer.max_epochs=1", "lr_finder.enabled=true", "lr_finder.num_steps=8"))
    assert "test/acc" in run.summary["test"]
    assert (run.run_dir / "lr_finder.png").is_file()
    assert "lr range test: 8 steps" in run.stdout + run.stderr


@pytest.mark.slow  # three subprocess runs
def test_a_text_classifier_stopped_by_sigterm_inside_an_epoch_resumes_exactly(run_train, corpus, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    preempting = tiny(corpus, "model._target_=models_for_tests.preempted_model",
                      "+model.builds=trainkit.models.sequence.SequenceClassifier", "trainer.log_every_n_steps=1",
                      "regularization.early_stopping.enabled=false")  # fmt: skip
    per_epoch = train_batches_an_epoch(corpus, world_size=1)
    straight = run_train(*preempting, "+model.preempt_at=0", isolated=True)
    # Three batches into the second epoch: the resume skips exactly the batches the token budget made first.
    preempted = run_train(*preempting, f"+model.preempt_at={per_epoch + 3}", isolated=True, check=False)
    assert preempted.returncode == 75, preempted.stderr[-3000:]
    resumed = run_train("resume=auto", *preempting, "+model.preempt_at=0", run_dir=preempted.run_dir, isolated=True)
    assert f"at epoch 1, batch 3, step {per_epoch + 3}" in resumed.stdout + resumed.stderr
    assert_same_training(resumed, straight)


@pytest.mark.slow  # a run and four resumes, ~25 s on 2 CPU cores
def test_a_resume_inside_an_epoch_refuses_other_batches_and_takes_them_at_the_epochs_end(run_train, corpus):
    """What the epoch's batches are made of (the token budget, the texts' cut, the cap on texts a batch) may not
    change while the checkpoint stands inside it: the resume would skip the first batches of another list."""
    per_epoch = train_batches_an_epoch(corpus, world_size=1)
    stopped = run_train(*tiny(corpus, f"trainer.max_steps={per_epoch + 3}"))  # 3 batches into epoch 1
    before = hashes_of_every_file(stopped.run_dir)
    halved = len(SizeBudgetBatches(train_lengths(corpus), 128, 16))
    for change, refusal in (
        (["data.max_tokens=128"], f"data.max_tokens: 256 -> 128 on a resume inside epoch 1 (after batch 3 of "
                                  f"{per_epoch}): the epoch would hold other batches ({halved} batches, not "),
        (["data.max_length=48", "model.max_length=64"], "data.max_length: 64 -> 48 on a resume inside epoch 1"),
        (["data.batch_size=4"], "data.batch_size: 16 -> 4 on a resume inside epoch 1"),
    ):  # fmt: skip
        refused = run_train(f"resume={stopped.run_dir}", "trainer.max_steps=null", *change, run_dir=stopped.run_dir,
                            check=False)  # fmt: skip
        errors = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 1 and len(errors) == 1, refused.stderr[-3000:]
        assert errors[0].startswith(f"error: {refusal}") and "trainer.max_epochs=2), then with it" in errors[0]
        assert unchanged_but_the_record(stopped.run_dir, before), change  # nothing trimmed, rewritten or trained
    # The way out it names: the epoch finished as it began, then the change at the epoch's end.
    run_train(f"resume={stopped.run_dir}", "trainer.max_steps=null", run_dir=stopped.run_dir)
    changed = run_train(f"resume={stopped.run_dir}", "trainer.max_epochs=3", "data.max_tokens=128",
                        run_dir=stopped.run_dir)  # fmt: skip
    assert "changed: trainer.max_epochs 2 -> 3, data.max_tokens 256 -> 128" in changed.stdout + changed.stderr
    steps = [epoch["step"] for epoch in changed.epoch_metrics()]
    assert steps == [per_epoch, 2 * per_epoch, 2 * per_epoch + halved]  # epoch 2: the new budget's batches
