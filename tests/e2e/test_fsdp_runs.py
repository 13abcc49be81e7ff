"""train.py with distributed=fsdp, 2 processes on gloo: a run preempted inside an epoch (SIGTERM) resumes
from its sharded checkpoints/last/ exactly (with 3 processes it is refused before they start), and its best.pt
(full weights) is read by eval.py in one process (a GPT sharded a Block a unit: test_language_model.py; a Hugging
Face model: test_hf.py)."""

import json
import os

import pytest

from conftest import ROOT, run_here
from helpers import assert_same_training, needs_local_launch

# 2 ranks x 4 batches of 64 digits an epoch, BatchNorm included; rank 0 is preempted in its 6th training
# step (inside epoch 1) or never.
FSDP = (
    "distributed=fsdp",
    "distributed.nproc_per_node=2",
    "model._target_=models_for_tests.PreemptedCNN",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=4",
    "trainer.log_every_n_steps=1",  # where the ranks agree on a stop
    "trainer.progress_bar=false",
    "print_config=false",
    "regularization.early_stopping.enabled=false",
)


@needs_local_launch  # train.py starts the workers: exit 75 and the refusal before any worker starts are its parent's
@pytest.mark.slow  # three 2-process runs
def test_fsdp_preempted_inside_an_epoch_resumes_exactly_and_its_best_pt_evaluates_in_one_process(
    run_train, tmp_path, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    straight = run_train(*FSDP, "+model.preempt_at=0", self_launched=True)
    assert straight.summary["world_size"] == 2
    preempted = run_train(*FSDP, "+model.preempt_at=6", check=False, self_launched=True)
    assert preempted.returncode == 75, preempted.stderr[-3000:]
    last = preempted.run_dir / "checkpoints" / "last"
    assert (last / ".metadata").is_file() and not (preempted.run_dir / "checkpoints" / "last.pt").exists()
    assert f"continue with: python train.py resume={last}" in preempted.stderr + preempted.stdout
    # Another number of processes inside an epoch: refused in the parent, from last/state.pt, before any worker starts.
    three = run_train(
        "resume=auto", *FSDP, "distributed.nproc_per_node=3", run_dir=preempted.run_dir, check=False, self_launched=True
    )
    assert three.returncode == 1 and "launching" not in three.stdout + three.stderr, three.stderr[-3000:]
    refusal = "error: distributed.nproc_per_node: this run has 3 processes but 2 processes wrote its checkpoint"
    assert three.stderr.strip().splitlines()[-1].startswith(f"{refusal} inside epoch 1"), three.stderr[-3000:]
    resumed = run_train("resume=auto", *FSDP, "+model.preempt_at=6", run_dir=preempted.run_dir, self_launched=True)
    assert f"resuming {last} at epoch 1, batch 2, step 6" in resumed.stdout + resumed.stderr
    assert_same_training(resumed, straight)  # metrics, test metrics and the gathered shards of last/

    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'eval'}", f"checkpoint={straight.run_dir}")
    assert code == 0, stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {key: metrics[key] for key in straight.summary["test"]} == pytest.approx(straight.summary["test"], rel=1e-6)
