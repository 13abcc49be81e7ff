"""distributed=fsdp's checkpoints/last/ directory as resume sees it: found once DCP's metadata is written,
read without its shards, torn copies removed, and refused under another distributed setting (no process group)."""

import pytest
import torch
from omegaconf import OmegaConf

from trainkit.checkpointing.checkpoint import remove_stale_temporary_files
from trainkit.checkpointing.files import CHECKPOINT_FORMAT, find_checkpoint, latest_checkpoint, read_checkpoint
from trainkit.checkpointing.resume import _refuse_another_checkpoint_layout
from trainkit.errors import ConfigError

REST = {"scheduler": {}, "epoch": 1, "step": 6, "batches_done": 2, "config": {"seed": 0}}


def sharded(directory, metadata: bool = True):
    directory.mkdir(parents=True)
    torch.save({"format": CHECKPOINT_FORMAT, **REST}, directory / "state.pt")
    if metadata:  # DCP writes it last
        (directory / ".metadata").write_bytes(b"")
    return directory


def test_resume_finds_last_only_once_its_metadata_is_written(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    sharded(checkpoints / "last", metadata=False)
    assert latest_checkpoint(checkpoints) is None
    with pytest.raises(ConfigError, match=r"without checkpoints/last\.pt"):
        find_checkpoint(tmp_path / "run")
    (checkpoints / "last" / ".metadata").write_bytes(b"")
    assert find_checkpoint(tmp_path / "run") == checkpoints / "last" == latest_checkpoint(checkpoints)
    state = read_checkpoint(checkpoints / "last")  # state.pt alone: the shards stay on disk
    assert (state["epoch"], state["batches_done"], state["step"]) == (1, 2, 6) and "model" not in state


def test_a_kill_between_the_two_renames_leaves_last_old_which_resume_takes(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    sharded(checkpoints / "last.old")
    assert latest_checkpoint(checkpoints) == checkpoints / "last.old"


def test_a_directory_without_metadata_is_one_line_naming_the_key(tmp_path):
    torn = sharded(tmp_path / "last", metadata=False)
    with pytest.raises(ConfigError) as error:
        read_checkpoint(torn)
    assert str(error.value).startswith("resume: ") and "no finished sharded checkpoint" in str(error.value)


def test_torn_and_replaced_sharded_checkpoints_are_removed(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    sharded(checkpoints / "last")
    sharded(checkpoints / "last.old")
    sharded(checkpoints / "last.tmp", metadata=False)
    assert sorted(remove_stale_temporary_files(checkpoints)) == ["last.old", "last.tmp"]
    assert [path.name for path in checkpoints.iterdir()] == ["last"]


@pytest.mark.parametrize("name, directory", [("none", True), ("ddp", True), ("fsdp", False)])
def test_another_checkpoint_layout_is_refused_in_one_line(tmp_path, name, directory):
    checkpoint = sharded(tmp_path / "last") if directory else tmp_path / "last.pt"
    with pytest.raises(ConfigError) as error:
        _refuse_another_checkpoint_layout(checkpoint, OmegaConf.create({"distributed": {"name": name}}))
    assert str(error.value).startswith(f"distributed: is {name}, but ") and "\n" not in str(error.value)


def test_a_weights_only_best_pt_is_refused_as_a_resume_before_hydra(tmp_path):
    from trainkit.checkpointing.checkpoint import save_checkpoint
    from trainkit.checkpointing.resume import rewrite_argv
    from trainkit.distributed.fsdp import NO_OPTIMIZER_STATE

    best = tmp_path / "run" / "checkpoints" / "best.pt"  # as distributed=fsdp writes it: the full weights alone
    save_checkpoint(best, {"format": CHECKPOINT_FORMAT, **REST, "model": {}, "optimizer": NO_OPTIMIZER_STATE})
    with pytest.raises(ConfigError) as error:
        rewrite_argv(["train.py", f"resume={best}"])
    assert str(error.value) == (
        f"resume: {best} holds weights without optimizer state (distributed=fsdp's best.pt), so it cannot be "
        f"resumed; resume the run directory (its checkpoints/last/), or start a new run with "
        f"finetune.pretrained_path={best}"
    )


def test_another_number_of_processes_inside_an_epoch_is_refused_before_workers_start(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conftest import ROOT
    from trainkit.checkpointing import resume
    from trainkit.config.schema import to_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        two = ["distributed=fsdp", "distributed.nproc_per_node=2"]
        config = to_dict(compose("config", overrides=two))
        three = [*two[:1], "distributed.nproc_per_node=3"]
        run_dir = tmp_path / "run"
        last = run_dir / "checkpoints" / "last"
        composed = compose("config", overrides=[f"resume={last}", *three])
    GlobalHydra.instance().clear()
    (run_dir / ".hydra").mkdir(parents=True)
    sharded(last)  # written by 2 processes inside epoch 1, after batch 2
    rest = {**REST, "config": config, "rng": [{}, {}], "early_stopping": {}}
    torch.save({"format": CHECKPOINT_FORMAT, **rest}, last / "state.pt")
    with pytest.raises(ConfigError) as error:  # in the parent: the checkpoint's state.pt and the config tell
        resume.resumed_config(composed, run_dir, overrides=[f"resume={last}", *three])
    assert str(error.value).startswith(
        "distributed.nproc_per_node: this run has 3 processes but 2 processes wrote its checkpoint inside epoch 1 "
        "(after batch 2)"
    )
