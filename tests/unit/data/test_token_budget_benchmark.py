"""scripts/token_budget_benchmark.py compares like with like: the fixed batch size it derives is the budget
run's mean batch, and the two train.py command lines differ only in how batches are made."""

import pytest
import torch

from helpers import load_script
from trainkit.data.size_budget import SizeBudgetBatches

LENGTHS = (torch.rand(3000, generator=torch.Generator().manual_seed(0)) ** 3 * 600 + 5).long()


def test_the_fixed_batch_size_is_the_budget_runs_mean_batch():
    benchmark = load_script("token_budget_benchmark")
    the_plan = benchmark.plan(LENGTHS, 2048, 64)
    batches = SizeBudgetBatches(LENGTHS, 2048, 64, seed=3)  # as train.py builds it: an epoch of one process
    batches.set_epoch(0)
    trained = list(batches)
    assert the_plan.budget_batches == len(trained)
    assert the_plan.fixed_batch_size == round(sum(len(batch) for batch in trained) / len(trained))
    rounding = len(trained) * 0.5 / the_plan.fixed_batch_size + 1  # the mean rounded to a whole batch size
    assert abs(the_plan.fixed_batches - len(trained)) <= rounding  # as many updates, but for the rounding


def test_the_two_runs_differ_only_in_how_batches_are_made():
    benchmark = load_script("token_budget_benchmark")
    args = benchmark.arguments(["--epochs", "2", "--fraction", "0.5", "device=cpu"])
    the_plan = benchmark.plan(LENGTHS, 2048, 64, args.fraction)
    runs = benchmark.commands(args, the_plan, "/tmp/run")
    shared = set(runs["budget"]) & set(runs["fixed"])
    budget, fixed = (set(runs[name]) - shared for name in ("budget", "fixed"))
    assert budget == {"data.max_tokens=2048", "data.batch_size=64"}
    assert fixed == {"data.max_tokens=null", f"data.batch_size={the_plan.fixed_batch_size}"}
    assert {"seed=0", "trainer.max_epochs=2", f"trainer.limit_train_batches={the_plan.limit}", "device=cpu"} <= set(
        runs["fixed"]
    )


def test_the_keys_it_sets_cannot_be_overridden():
    benchmark = load_script("token_budget_benchmark")
    with pytest.raises(SystemExit):
        benchmark.arguments(["data.batch_size=16"])
