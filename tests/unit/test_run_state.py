"""Run (trainkit/run.py): what a run trains with is built before the loop; the loop moves `run.state` alone."""

import ast
from pathlib import Path

from omegaconf import OmegaConf

from trainkit.run import TrainState

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"
LOOP_FUNCTIONS = ("train_step", "update", "log_update", "train_one_epoch", "save_checkpoints", "stop_reason",
                  "validate_epoch")  # fmt: skip


def written_run_fields(node: ast.AST) -> list[str]:
    """`run.<field>` that `node` assigns (=, +=, a tuple's part), other than through `run.state`."""
    written = []
    for child in ast.walk(node):
        targets = child.targets if isinstance(child, ast.Assign) else [child.target] if isinstance(
            child, (ast.AugAssign, ast.AnnAssign)) else []  # fmt: skip
        for target in targets:
            for part in ast.walk(target):
                is_run = isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "run"
                if is_run and part.attr != "state":
                    written.append(f"line {part.lineno}: run.{part.attr}")
    return written


def test_the_loop_writes_only_where_the_run_stands() -> None:
    tree = ast.parse(TRAIN_PY.read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert set(LOOP_FUNCTIONS) <= set(functions), "train.py renamed a loop function: update LOOP_FUNCTIONS"
    epochs = [node for node in ast.walk(functions["train"]) if isinstance(node, ast.For)]
    assert epochs, "train() has no epoch loop"
    written = [field for name in LOOP_FUNCTIONS for field in written_run_fields(functions[name])]
    written += [field for loop in epochs for field in written_run_fields(loop)]
    assert not written, f"the loop reassigns what build_run built (move it to run.state or before the loop): {written}"


def test_a_checkpoint_saved_inside_an_epoch_resumes_inside_it() -> None:
    cfg = OmegaConf.create({"trainer": {"max_steps": None, "max_epochs": 5},
                            "regularization": {"early_stopping": {"enabled": False, "patience": 3}}})  # fmt: skip
    state = TrainState(epoch=2, step=30, batches_done=4, best_metrics={"epoch": 1}, last_metrics={"epoch": 1})
    mid_epoch = {**state.state_dict(unfinished=True, seconds_here=5.0), "wandb_run_id": "abc"}
    assert mid_epoch["wall_seconds"] == 5.0 and mid_epoch["batches_done"] == 4

    resumed = TrainState(earlier_seconds=99.0)
    resumed.load_state_dict(mid_epoch, cfg)
    assert (resumed.epoch, resumed.step, resumed.batches_done) == (2, 30, 4)  # the unfinished epoch, from batch 4
    assert resumed.tracker_run_ids == {"wandb": "abc"} and resumed.earlier_seconds == 5.0
    assert resumed.best_metrics == {"epoch": 1} and resumed.stopping is None

    at_the_end = state.state_dict(unfinished=False, seconds_here=1.0)
    assert at_the_end["batches_done"] == 0
    resumed.load_state_dict(at_the_end, cfg)
    assert (resumed.epoch, resumed.batches_done) == (3, 0)  # the next epoch, from its start
