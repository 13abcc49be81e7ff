"""A sharded checkpoints/last/ directory (a strategy that shards the model writes it: every rank's shards and
state.pt) as resume sees it: found once DCP's metadata is written, read without its shards, torn copies removed,
refused where the run's strategy writes last.pt, and its weights-only best.pt refused as a resume (no process group).
What distributed=fsdp itself refuses: tests/unit/distributed/test_fsdp.py."""

import pytest
from omegaconf import OmegaConf

from helpers import sharded_checkpoint
from trainkit.checkpointing.checkpoint import remove_stale_temporary_files
from trainkit.checkpointing.files import CHECKPOINT_FORMAT, find_checkpoint, latest_checkpoint, read_checkpoint
from trainkit.checkpointing.resume import _refuse_another_checkpoint_layout
from trainkit.errors import ConfigError

REST = {"scheduler": {}, "epoch": 1, "step": 6, "batches_done": 2, "config": {"seed": 0}}


def sharded(directory, metadata: bool = True):
    return sharded_checkpoint(directory, REST, metadata)


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


@pytest.mark.parametrize("name", ["none", "ddp"])
def test_a_sharded_checkpoint_is_refused_in_one_line_where_the_run_writes_last_pt(tmp_path, name):
    resolved = OmegaConf.create({"distributed": {"name": name, "parallel": None}})
    with pytest.raises(ConfigError) as error:
        _refuse_another_checkpoint_layout(
            sharded(tmp_path / "last"), {"config": {"distributed": {"name": "x"}}}, resolved
        )
    assert str(error.value).startswith(f"distributed: is {name}, but distributed=x wrote ") and "\n" not in str(
        error.value
    )
    assert str(error.value).endswith(
        "resume with the distributed setting that wrote it, or start a new run with the one you want"
    )


def test_a_weights_only_best_pt_is_refused_as_a_resume_before_hydra(tmp_path):
    from trainkit.checkpointing.checkpoint import save_checkpoint
    from trainkit.checkpointing.resume import rewrite_argv

    best = tmp_path / "run" / "checkpoints" / "best.pt"  # as a sharded run writes it: the full weights alone
    no_optimizer_state = {"state": {}, "param_groups": []}
    save_checkpoint(best, {"format": CHECKPOINT_FORMAT, **REST, "model": {}, "optimizer": no_optimizer_state})
    with pytest.raises(ConfigError) as error:
        rewrite_argv(["train.py", f"resume={best}"])
    assert str(error.value) == (
        f"resume: {best} holds weights without optimizer state (a sharded run's best.pt), so it cannot be "
        f"resumed; resume the run directory (its checkpoints/last/), or evaluate the file with "
        f"python eval.py checkpoint={best}"
    )
