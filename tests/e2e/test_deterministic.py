"""trainer.deterministic: two runs give bit-identical weights, and an op without a deterministic
kernel stops the run with one line naming the switch (trainkit.runtime)."""

import torch

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.progress_bar=false", "print_config=false")


def test_deterministic_runs_give_identical_weights(run_train):
    overrides = ("trainer.deterministic=true", *QUICK)
    first, second = run_train(*overrides), run_train(*overrides)
    checkpoints = [run.run_dir / "checkpoints" / "last.pt" for run in (first, second)]
    weights = [torch.load(path, weights_only=True)["model"] for path in checkpoints]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_an_op_without_a_deterministic_kernel_is_one_line_naming_the_switch(run_train):
    run = run_train("trainer.deterministic=true", "model._target_=models_for_tests.WithoutDeterministicKernel",
                    "model.widths=[16,32]", *QUICK, check=False)  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "error: trainer.deterministic: index_add_cuda_ does not have a deterministic implementation; "
        "set trainer.deterministic=false, or use another op there"
    ]
