"""optimizer=muon in train.py on the byte-level GPT: a SIGTERM inside an epoch (with gradient accumulation)
resumes to the uninterrupted run's weights, two DDP processes train with it, and the LR finder sets both parts."""

import os
import re

import pytest
import torch
from test_language_model import corpus, tiny  # noqa: F401  # corpus: a fixture, used by name

from conftest import ROOT
from helpers import assert_same_training

MUON = ("optimizer=muon", "optimizer.lr=3e-3", "scheduler=wsd", "scheduler.warmup_epochs=0.5")


@pytest.mark.slow  # three subprocess runs
def test_muon_stopped_by_sigterm_inside_an_epoch_resumes_exactly(run_train, corpus, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    preempting = tiny(corpus, *MUON, "model._target_=gpt_for_tests.PreemptedGPT", "trainer.log_every_n_steps=1",
                      "trainer.accumulate_grad_batches=2", "regularization.early_stopping.enabled=false")  # fmt: skip
    straight = run_train(*preempting, "+model.preempt_at=0", isolated=True)
    assert "Muon 12,288 parameters (4 tensors)" in straight.stderr + straight.stdout  # 1 block: qkv, proj, fc, proj
    preempted = run_train(*preempting, "+model.preempt_at=8", isolated=True, check=False)  # 3 updates an epoch
    assert preempted.returncode == 75, preempted.stderr[-3000:]
    resumed = run_train("resume=auto", *preempting, "+model.preempt_at=0", run_dir=preempted.run_dir, isolated=True)
    assert "at epoch 1, batch 2, step 4" in resumed.stdout + resumed.stderr
    assert_same_training(resumed, straight)


@pytest.mark.slow  # a 2-process run
def test_muon_trains_in_two_ddp_processes(run_train, corpus):  # noqa: F811
    run = run_train(*tiny(corpus, *MUON, "distributed=ddp", "distributed.nproc_per_node=2"))
    assert run.summary["world_size"] == 2
    first, last = run.epoch_metrics()[0], run.epoch_metrics()[-1]
    assert last["val/bpb"] < first["val/bpb"] < 8


@pytest.mark.slow  # trains in this process (run_train)
def test_the_lr_finder_sweeps_and_sets_both_parts(run_train, corpus):  # noqa: F811
    finder = ("lr_finder.enabled=true", "lr_finder.apply=true", "lr_finder.num_steps=10", "trainer.max_epochs=1")
    run = run_train(*tiny(corpus, *MUON, *finder))
    suggested = float(re.findall(r"suggested lr ([0-9.]+e[+-][0-9]+)", run.stderr + run.stdout)[0])
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    groups = checkpoint["optimizer"]["param_groups"]
    assert len(groups) == 4 and checkpoint["scheduler"]["base_lrs"] == pytest.approx([suggested] * 4, rel=1e-2)
    assert {group["initial_lr"] for group in groups} == set(checkpoint["scheduler"]["base_lrs"])  # one LR, both parts
