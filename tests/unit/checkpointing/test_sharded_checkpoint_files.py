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
