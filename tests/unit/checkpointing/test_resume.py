"""trainkit.checkpointing.resume and trainkit.checkpointing.files: where a resume runs, with which config, and the
one-line errors for every unusable checkpoint or output path. In-process: no training."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import ROOT
from trainkit.checkpointing import checkpoint, continued_run, files, resume
from trainkit.checkpointing.files import CHECKPOINT_FORMAT, check_model_fits, check_output_dir, load_optimizer_state
from trainkit.config.schema import to_dict
from trainkit.errors import ConfigError
from trainkit.models.build import build_model


@pytest.fixture
def compose_config():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        yield lambda *overrides: compose("config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def make_run(run_dir: Path, config: dict, overrides=(), **state) -> Path:
    """A run directory as train.py leaves it: .hydra/overrides.yaml and checkpoints/last.pt."""
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / ".hydra" / "overrides.yaml")
    last = run_dir / "checkpoints" / "last.pt"
    base = {"format": CHECKPOINT_FORMAT, "model": {}, "optimizer": {}, "scheduler": {}, "epoch": 1, "step": 6}
    checkpoint.save_checkpoint(last, {**base, "batches_done": 0, "config": config, "early_stopping": {}, **state})
    return last


def refused(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as error:
        resume.rewrite_argv(["train.py", *argv])
    return str(error.value)


def test_resume_runs_in_the_checkpoints_directory_with_its_overrides_replayed_first(tmp_path):
    last = make_run(tmp_path / "run", {}, overrides=["trainer.max_epochs=3", "resume=old", "optimizer.lr=0.2"])
    for target in (tmp_path / "run", last):  # the run directory or its last.pt
        argv = resume.rewrite_argv(["train.py", f"resume={target}", "optimizer.lr=0.05"])
        assert argv == [
            "train.py",
            f"hydra.run.dir='{tmp_path / 'run'}'",  # quoted for Hydra: a path may hold commas
            "hydra.output_subdir=null",
            "trainer.max_epochs=3",
            "optimizer.lr=0.2",  # the run's own, then the new ones, which win
            f"resume='{target}'",
            "optimizer.lr=0.05",
        ]
    assert "continues in the checkpoint's own run directory" in refused(
        [f"resume={last}", f"hydra.run.dir={tmp_path / 'elsewhere'}"]
    )
    assert refused(["-m", f"resume={last}", "seed=1,2"]).startswith("resume: continues one run and cannot be part")
    assert resume.rewrite_argv(["train.py", "-m", "resume=auto"]) == ["train.py", "-m", "resume=auto"]


def test_this_commands_own_overrides_are_those_from_its_resume_on_wherever_it_was_typed(tmp_path):
    """No state kept between the rewrite and main: Hydra's task overrides tell which keys this command sets."""
    make_run(tmp_path / "run", {}, overrides=["trainer.max_epochs=3", "resume=old", "optimizer.lr=0.2"])
    argv = resume.rewrite_argv(["train.py", "optimizer.lr=0.05", f"resume={tmp_path / 'run'}", "seed=4"])
    task_overrides = [arg for arg in argv[1:] if not arg.startswith("hydra.")]  # what Hydra composes the task with
    own = [f"resume='{tmp_path / 'run'}'", "optimizer.lr=0.05", "seed=4"]
    assert task_overrides == ["trainer.max_epochs=3", "optimizer.lr=0.2", *own]
    assert resume.own_overrides(task_overrides) == own
    elsewhere = tmp_path / "elsewhere.pt"  # a checkpoint outside a run directory: nothing replayed
    shutil.copy(tmp_path / "run" / "checkpoints" / "last.pt", elsewhere)
    argv = resume.rewrite_argv(["train.py", "seed=4", f"resume={elsewhere}", f"hydra.run.dir={tmp_path / 'new'}"])
    assert argv[1:] == [f"resume='{elsewhere}'", "seed=4", f"hydra.run.dir={tmp_path / 'new'}"]
    assert resume.own_overrides(argv[1:3]) == argv[1:3]


def test_each_unusable_checkpoint_is_one_line_before_hydra(tmp_path):
    good = make_run(tmp_path / "run", {})
    cases = {
        "missing.pt": None,
        "folder": "dir",
        "empty.pt": b"",
        "garbage.pt": b"not a checkpoint at all",
        "truncated.pt": good.read_bytes()[: good.stat().st_size // 2],
    }
    for name, content in cases.items():
        if content == "dir":
            (tmp_path / name).mkdir()
        elif content is not None:
            (tmp_path / name).write_bytes(content)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    state = torch.load(good, weights_only=True)
    torch.save({**state, "format": CHECKPOINT_FORMAT + 1}, tmp_path / "newer.pt")
    torch.save({**state, "format": 0}, tmp_path / "older.pt")
    expected = {
        "missing.pt": "does not exist",
        "folder": "is a directory without checkpoints/last.pt",
        "empty.pt": "is empty (0 bytes)",
        "garbage.pt": "is not a PyTorch checkpoint",
        "truncated.pt": "is truncated",
        "foreign.pt": "is not a trainkit training checkpoint (it holds weights)",
        "newer.pt": f"format {CHECKPOINT_FORMAT + 1}, this code reads format {CHECKPOINT_FORMAT} (a newer",
        "older.pt": f"has checkpoint format 0, this code reads format {CHECKPOINT_FORMAT} (an older",
    }
    for name, fragment in expected.items():
        message = refused([f"resume={tmp_path / name}"])
        assert message.startswith("resume: ") and fragment in message and "\n" not in message, (name, message)


def test_another_key_finds_the_first_checkpoint_named_and_says_its_name(tmp_path):
    last = make_run(tmp_path / "run", {})
    assert files.find_checkpoint(tmp_path / "run", key="checkpoint", names=("best.pt", "last.pt")) == last
    checkpoint.copy_checkpoint(last, last.with_name("best.pt"))
    assert files.find_checkpoint(tmp_path / "run", key="checkpoint", names=("best.pt", "last.pt")).name == "best.pt"
    assert files.find_checkpoint(tmp_path / "run").name == "last.pt"  # resume continues from the latest
    with pytest.raises(ConfigError, match=r"^checkpoint: .* does not exist; give a run directory or its checkpoints/b"):
        files.find_checkpoint(tmp_path / "nope", key="checkpoint", names=("best.pt", "last.pt"))
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^checkpoint: .* is empty"):
        files.read_checkpoint(tmp_path / "empty.pt", key="checkpoint")


def test_a_checkpoint_from_before_the_nodes_were_constructor_arguments_is_read_as_if_written_now(
    tmp_path, compose_config
):
    """The data node named a factory of old (the model's fine-tuning keys: tests/unit/models/test_finetune.py)."""
    config = to_dict(compose_config())
    old_data = {**config["data"], "_target_": "trainkit.data.datasets.load_digits"}  # the factory of old
    last = make_run(tmp_path / "run", config | {"data": old_data})
    saved = files.read_checkpoint(last)["config"]
    assert saved["model"] == config["model"]  # only constructor arguments: instantiate(cfg.model) builds it
    assert saved["data"]["_target_"] == "trainkit.data.datasets.Digits"


def test_a_script_that_continues_no_run_refuses_resume_before_hydra(tmp_path):
    last = make_run(tmp_path / "run", {})
    with pytest.raises(ConfigError, match=r"^resume: eval.py continues no run; drop resume="):
        resume.rewrite_argv(["eval.py", f"resume={last}"], resumes=False)
    assert resume.rewrite_argv(["eval.py", "checkpoint=x"], resumes=False) == ["eval.py", "checkpoint=x"]


def test_a_bad_resume_path_exits_with_one_line_and_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "new"
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), f"resume={tmp_path / 'nope.pt'}", f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"error: resume: {tmp_path / 'nope.pt'} does not exist; give a run directory or its checkpoints/last.pt"
    ]
    assert not run_dir.exists()


def test_an_unusable_output_directory_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    message = refused([f"hydra.run.dir={tmp_path / 'file' / 'run'}"])
    assert message.startswith("hydra.run.dir: ") and "is a file, not a directory" in message
    check_output_dir(str(tmp_path / "new" / "deeper"))  # creatable: fine
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]  # and the check left nothing behind


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["hydra.run.dir=/proc/run"], "/proc/run cannot be created: /proc takes no new directories"),
        (["hydra.run.dir=/sys/run"], "/sys/run cannot be created: /sys takes no new directories"),
        (["-m", "hydra.sweep.dir=/proc/x"], "/proc/x cannot be created: /proc takes no new directories"),
        ([f"hydra.run.dir=/tmp/{'n' * 300}/run"], "cannot be created: File name too long; choose another path"),
    ],
    ids=["proc", "sys", "sweep-in-proc", "name-over-255-bytes"],
)
def test_every_os_error_making_the_output_directory_is_one_line_naming_the_path(argv, reason):
    message = refused(argv)
    assert message.startswith("hydra.sweep.dir: " if "-m" in argv else "hydra.run.dir: ") and reason in message


def test_a_path_with_commas_quotes_and_non_ascii_reaches_hydra_as_one_value(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    run_dir = tmp_path / "optimizer.lr=0.1,seed=1 it's é"
    last = make_run(run_dir, {})
    argv = resume.rewrite_argv(["train.py", f"resume={run_dir}"])  # as a shell passes a pasted, quoted command
    parsed = OverridesParser.create().parse_overrides(argv[1:])
    assert {o.key_or_group: o.value() for o in parsed if not o.is_sweep_override()} == {
        "hydra.run.dir": str(run_dir),
        "hydra.output_subdir": None,
        "resume": str(run_dir),
    }
    assert last.exists()
    # eval.py's checkpoint= (any existing path Hydra would misread): quoted the same way.
    [checkpoint] = resume.rewrite_argv(["eval.py", f"checkpoint={last}"], resumes=False)[1:]
    assert OverridesParser.create().parse_overrides([checkpoint])[0].value() == str(last)


NOBODY = 65534  # uid and gid of the unprivileged user `nobody`


def as_unprivileged_user(function) -> str:
    """`function()`'s answer (a string), as this user, or, under root (who may write anywhere; CI runs
    as root), in a forked child that drops to `nobody` first. A fork and not a new interpreter:
    nobody may not read /root, where Python may be installed, but the forked child needs nothing new."""
    if os.geteuid() != 0:
        return function()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, whatever happens, and never return into pytest
        try:
            os.close(read)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, function().encode())
        except BaseException as error:
            os.write(write, f"the child failed: {error!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


def test_an_output_directory_without_write_permission_is_one_line(tmp_path):
    # Under root, nobody must reach the folders: a world-readable place outside pytest's private tmp.
    place = Path(tempfile.mkdtemp())
    try:
        place.chmod(0o755)
        (place / "locked").mkdir(mode=0o555)
        (place / "open").mkdir()
        (place / "open").chmod(0o777)  # mkdir's mode goes through the umask

        def answers() -> str:  # one line a folder: its refusal, or "accepted"
            lines = []
            for name in ("locked", "open"):
                try:
                    check_output_dir(str(place / name / "run"))
                    lines.append("accepted")
                except ConfigError as error:
                    lines.append(str(error))
            return "\n".join(lines)

        answer = as_unprivileged_user(answers)
        assert answer.splitlines()[0].endswith(f"no write permission in {place / 'locked'}; choose another path"), (
            answer
        )
        assert answer.splitlines()[1] == "accepted"  # the same place, writable: so the refusal above is the lock's
    finally:
        shutil.rmtree(place)


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_how_much_space_is_left(tmp_path, monkeypatch):
    last = tmp_path / "checkpoints" / "last.pt"
    checkpoint.save_checkpoint(last, {"step": 1})

    def full_disk(state, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(ConfigError) as error:
        checkpoint.save_checkpoint(last, {"step": 2})
    assert str(error.value).startswith(f"{last}: no space left on the device (") and "MiB free" in str(error.value)
    assert "the previous last.pt is intact" in str(error.value)
    monkeypatch.undo()
    assert torch.load(last, weights_only=True) == {"format": 1, "step": 1} and not list(last.parent.glob("*.tmp"))


def test_stale_temporary_files_are_removed(tmp_path):
    (tmp_path / "last.pt.tmp").write_bytes(b"torn")
    (tmp_path / "last.pt").write_bytes(b"kept")
    assert checkpoint.remove_stale_temporary_files(tmp_path) == ["last.pt.tmp"]
    assert [path.name for path in tmp_path.iterdir()] == ["last.pt"]


def test_resumed_config_is_the_checkpoints_with_the_new_overrides_on_top(tmp_path, compose_config):
    def resumed(run_dir, *overrides):  # as `python train.py <overrides>` composes and resumes
        return resume.resumed_config(compose_config(*overrides), run_dir, overrides=list(overrides))

    original = compose_config("trainer.max_epochs=3")
    saved = to_dict(original)
    saved["data"]["batch_size"] = 48  # a value the run found itself (a searched batch size): in its checkpoint
    weights = build_model(original.model).state_dict()
    last = make_run(tmp_path / "run", saved, model=weights, early_stopping={"epochs_without_improvement": 0})
    new = ["optimizer.lr=0.05", "trainer.max_epochs=5", "regularization.dropout=0.3"]
    cfg, finished = resumed(tmp_path / "run", f"resume={last}", *new)
    assert not finished and cfg.resume == str(last)
    assert (cfg.optimizer.lr, cfg.trainer.max_epochs, cfg.data.batch_size) == (0.05, 5, 48)
    assert cfg.model.dropout == 0.3  # follows regularization.dropout, as the config links it
    assert OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml").data.batch_size == 48

    with pytest.raises(
        ConfigError, match=r"^optimizer: is torch\.optim\.AdamW but the checkpoint's optimizer state is"
    ):
        resumed(tmp_path, f"resume={last}", "optimizer=adamw", "trainer.max_epochs=5")
    sized = make_run(tmp_path / "sized", saved, model=weights, early_stopping={})
    with pytest.raises(ConfigError, match=r"^model: features\.0\.weight is \[32, 1, 3, 3\] in the checkpoint but \[16"):
        resumed(tmp_path / "sized", f"resume={sized}", "model.widths=[16,64,128]")
    assert not (tmp_path / "sized" / ".hydra" / "config.yaml").exists()  # nothing written for a refused resume
    with pytest.raises(ConfigError, match=r"^experiment: on a resume, give the keys to change one by one"):
        resumed(tmp_path, f"resume={last}", "experiment=digits")


def test_another_plan_of_the_epoch_is_refused_inside_it_naming_what_changed(compose_config):
    config = to_dict(compose_config())
    batches = [[4, 1], [0, 3], [2, 5]]
    plan = resume.epoch_plan(batches, num_batches=3, accumulate=1)
    inside = {"config": config, "epoch": 1, "batches_done": 2, "epoch_plan": [plan]}
    cpu = torch.device("cpu")
    resume.refuse_another_epoch_plan(inside, resume.epoch_plan(batches, 3, 1), config, 0, cpu)  # the same: resumes
    resume.refuse_another_epoch_plan(inside, resume.epoch_plan([*batches, [6, 7]], 3, 1), config, 0, cpu)  # cut
    halved = {**config, "data": {**config["data"], "batch_size": 1}, "trainer": {**config["trainer"], "max_epochs": 9}}
    with pytest.raises(ConfigError) as error:
        resume.refuse_another_epoch_plan(inside, resume.epoch_plan([[4], [1], [0], [3]], 6, 1), halved, 0, cpu)
    assert str(error.value) == (
        "data.batch_size: 64 -> 1 on a resume inside epoch 1 (after batch 2 of 3): the epoch would hold other "
        "batches (4 batches, not 3): skipping the 2 trained would train some samples twice, others never; at an "
        "epoch's end it is taken: resume without it until epoch 1 ends (trainer.max_epochs=2), then with it, or "
        "resume from a checkpoint of an epoch's end (checkpoints/best.pt, if a whole epoch wrote it)"
    )  # trainer.max_epochs changed too, but makes no batch: not named
    with pytest.raises(ConfigError, match=r"^data: its files changed since the checkpoint .* \(as many, of other "):
        resume.refuse_another_epoch_plan(inside, resume.epoch_plan([[4, 1], [0, 5], [2, 3]], 3, 1), config, 0, cpu)
    grouped = {**config, "trainer": {**config["trainer"], "accumulate_grad_batches": 2}}
    with pytest.raises(ConfigError, match=r"^trainer.accumulate_grad_batches: 1 -> 2 .* would group 2 batches to an "):
        resume.refuse_another_epoch_plan(inside, resume.epoch_plan(batches, 3, 2), grouped, 0, cpu)
    at_the_end = {**inside, "batches_done": 0, "epoch_plan": None}  # an epoch's end: any batches are taken
    resume.refuse_another_epoch_plan(at_the_end, resume.epoch_plan([[4]], 1, 1), halved, 0, cpu)


def test_another_number_of_processes_is_refused_inside_an_epoch_only():
    # Four ranks' RNG snapshots: four processes wrote it. Inside an epoch, batch 5 of a 2-process shard is elsewhere.
    inside = {"rng": [{}] * 4, "epoch": 3, "batches_done": 5}
    with pytest.raises(ConfigError) as error:
        resume.refuse_another_world_size_inside_an_epoch(inside, world_size=2)
    assert str(error.value) == (
        "distributed.nproc_per_node: this run has 2 processes but 4 processes wrote its checkpoint inside epoch 3 "
        "(after batch 5): the batches already trained would be miscounted; resume with 4 processes, or from an "
        "epoch's end"
    )
    resume.refuse_another_world_size_inside_an_epoch(inside, world_size=4)
    resume.refuse_another_world_size_inside_an_epoch({**inside, "batches_done": 0}, world_size=2)  # an epoch's end


def test_finished_runs_say_how_to_train_on(compose_config):
    cfg = compose_config("trainer.max_epochs=3", "regularization.early_stopping.patience=2")
    state = {"epoch": 2, "step": 60, "batches_done": 0, "early_stopping": {"epochs_without_improvement": 0}}
    assert "resume with a higher trainer.max_epochs, e.g. trainer.max_epochs=6" in continued_run.finished_message(
        state, cfg, Path("run")
    )
    state = {**state, "epoch": 1, "early_stopping": {"epochs_without_improvement": 2}}
    assert "early stopping: no improvement for 2 epochs" in continued_run.finished_message(state, cfg, Path("run"))
    state["early_stopping"] = {"epochs_without_improvement": 1}
    assert continued_run.finished_message(state, cfg, Path("run")) is None


def test_metrics_written_after_the_checkpoint_are_dropped(tmp_path):
    lines = [
        {"epoch": 0, "step": 20, "val/loss": 1},
        {"epoch": 1, "step": 25, "train/step_loss": 1},
        {"epoch": 1, "step": 27, "val/loss": 1},
        {"epoch": 1, "step": 27, "test/acc": 1},
        {"epoch": 1, "step": 30, "train/step_loss": 1},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    continued_run.trim_metrics(path, {"epoch": 1, "step": 27, "batches_done": 7})  # stopped inside epoch 1, at step 27
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:2]


def test_weights_and_optimizer_of_another_layout_are_one_line():
    small, wide = torch.nn.Sequential(torch.nn.Linear(3, 4)), torch.nn.Sequential(torch.nn.Linear(3, 8))
    with pytest.raises(ConfigError, match=r"^model: 0.weight is \[4, 3\] in the checkpoint but \[8, 3\] in this model"):
        check_model_fits(small.state_dict(), wide)
    one_group = torch.optim.SGD(small.parameters(), lr=0.1)
    two_groups = torch.optim.SGD([{"params": [small[0].weight]}, {"params": [small[0].bias]}], lr=0.1)
    with pytest.raises(ConfigError, match=r"^optimizer: the checkpoint's optimizer has parameter groups of \[1, 1\]"):
        load_optimizer_state(one_group, two_groups.state_dict())


def test_resume_auto_in_a_directory_named_after_the_launch_time_warns_that_it_can_never_continue(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):

        def composed(*overrides):
            return compose("config", overrides=["resume=auto", *overrides], return_hydra_config=True)

        assert resume.unfixed_directory(composed().hydra) == "hydra.run.dir"
        assert resume.unfixed_directory(composed("hydra.run.dir=outputs/runs/job-42").hydra) is None
        assert resume.unfixed_directory(composed("hydra.mode=MULTIRUN").hydra) == "hydra.sweep.dir"
        assert resume.unfixed_directory(composed("hydra.mode=MULTIRUN", "hydra.sweep.dir=outputs/s").hydra) is None
        cfg, unfixed_directory = composed(), resume.unfixed_directory
        monkeypatch.setattr(resume, "unfixed_directory", lambda: unfixed_directory(cfg.hydra))  # as in a Hydra run
        resume.resumed_config(cfg, tmp_path)
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # submitit requeues the pickled job, directory included
        assert unfixed_directory(composed("hydra.mode=MULTIRUN").hydra) is None
    GlobalHydra.instance().clear()
    [warning] = [record.message for record in caplog.records if record.levelname == "WARNING"]
    assert warning.startswith(f"resume=auto: no checkpoint in {tmp_path}: starting a new run; hydra.run.dir is named")
    assert "set hydra.run.dir=<a fixed directory>" in warning


def test_a_summary_counts_only_for_its_own_checkpoint_and_a_retest_drops_only_the_test_line(tmp_path):
    state = {"epoch": 1, "step": 40, "batches_done": 0}
    assert not continued_run.has_summary(tmp_path, state)
    (tmp_path / "summary.json").write_text('{"steps": 20')  # torn by a kill while it was written
    assert not continued_run.has_summary(tmp_path, state)
    (tmp_path / "summary.json").write_text('{"steps": 20}')  # an earlier part's, before a longer resume
    assert not continued_run.has_summary(tmp_path, state)
    (tmp_path / "summary.json").write_text('{"steps": 40}')
    assert continued_run.has_summary(tmp_path, state)

    lines = [
        {"epoch": 0, "step": 20, "val/loss": 1},
        {"epoch": 0, "step": 20, "test/acc": 1},  # an earlier part's test: history
        {"epoch": 1, "step": 40, "val/loss": 1},
        {"epoch": 1, "step": 40, "test/acc": 1},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    continued_run.trim_metrics(path, {"epoch": 1, "step": 40, "batches_done": 7}, retested=True)  # a max_steps stop
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:3]


def test_a_patience_of_one_epoch_is_said_in_the_singular(compose_config):
    cfg = compose_config("trainer.max_epochs=3", "regularization.early_stopping.patience=1")
    state = {"epoch": 1, "step": 60, "batches_done": 0, "early_stopping": {"epochs_without_improvement": 1}}
    assert "(early stopping: no improvement for 1 epoch); " in continued_run.finished_message(state, cfg, Path("run"))


def test_a_sweeps_job_resumed_with_another_value_of_a_key_its_overrides_set_is_another_trial(tmp_path):
    """`-m ... resume=auto` (and a rerun sweep): job N's directory must hold the same trial; training longer is the
    one change every job may take, and a key the overrides do not set is the resume's to change."""
    with pytest.raises(ConfigError, match=r"^hydra\.sweep\.dir: .*\(seed 3 -> 7\)"):
        resume.refuse_another_trial(["seed 3 -> 7"], ["seed=7", "resume=auto"], tmp_path)
    resume.refuse_another_trial(["trainer.max_epochs 1 -> 2"], ["seed=3", "trainer.max_epochs=2"], tmp_path)
    resume.refuse_another_trial(["optimizer.lr 0.1 -> 0.2"], ["seed=3"], tmp_path)
    with pytest.raises(ConfigError, match=r"\(model\.width 8 -> 16\)"):  # a group chosen anew
        resume.refuse_another_trial(["model.width 8 -> 16"], ["model=other"], tmp_path)
