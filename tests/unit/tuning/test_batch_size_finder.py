"""Batch-size finder: converges on a simulated memory limit, honours a memory cap, fails clearly."""

import logging

import pytest
import torch
import torch.nn.functional as F
from test_step_memory import out_of_memory_errors
from torch import nn

from conftest import composed
from helpers import backward_step, config_check_tests, record_run
from trainkit.config.validation import problems
from trainkit.errors import ConfigError
from trainkit.models.small_cnn import SmallCNN
from trainkit.tuning import batch_size_finder
from trainkit.tuning.batch_size_finder import find_batch_size
from trainkit.tuning.step_memory import measure_step_memory, training_step_probe

CPU = torch.device("cpu")


def simulated_limit(limit: int, error: Exception | None = None):
    """A try_step that runs out of memory above `limit` samples, and records what it was asked."""
    tried = []

    def try_step(batch_size: int) -> None:
        tried.append(batch_size)
        if batch_size > limit:
            raise error or RuntimeError(f"CUDA out of memory. Tried to allocate {batch_size} MiB")

    return try_step, tried


def test_converges_on_the_exact_limit_then_keeps_the_safety_margin(caplog):
    try_step, tried = simulated_limit(300)
    with caplog.at_level(logging.INFO, logger="trainkit.tuning.batch_size_finder"):
        result = find_batch_size(try_step, start=2, max_batch_size=4096, safety_margin=0.9)
    assert result == 270  # floor(300 * 0.9)
    assert tried[:9] == [2, 4, 8, 16, 32, 64, 128, 256, 512]  # doubling until the first failure
    assert 300 in tried and 301 in tried  # the binary search pinned the boundary exactly
    assert max(size for size in tried if size <= 300) == 300
    assert len(tried) <= 9 + 8  # log2(512 - 256) more tries at most
    assert "batch size 512: does not fit" in caplog.text and "using 270" in caplog.text


@pytest.mark.parametrize("error", out_of_memory_errors())
def test_every_kind_of_out_of_memory_error_counts_as_not_fitting(error):
    try_step, _ = simulated_limit(100, error)
    assert find_batch_size(try_step, start=4, safety_margin=1.0, device="cpu") == 100


def test_other_errors_are_bugs_and_propagate():
    def try_step(batch_size):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        find_batch_size(try_step)


def test_max_batch_size_bounds_the_search_and_takes_no_memory_margin(caplog):
    try_step, tried = simulated_limit(10**9)
    with caplog.at_level(logging.INFO, logger="trainkit.tuning.batch_size_finder"):
        # Stopped at the user's cap, not at memory: the safety margin (for memory) does not apply.
        assert find_batch_size(try_step, start=3, max_batch_size=100, safety_margin=0.9) == 100
    assert tried == [3, 6, 12, 24, 48, 96, 100]  # max_batch_size itself is tried last
    assert "safety margin" not in caplog.text
    try_step, _ = simulated_limit(10**9)
    assert find_batch_size(try_step, start=2, max_batch_size=256, safety_margin=0.9) == 256  # not 230


def test_a_memory_limit_just_below_max_batch_size_keeps_the_margin():
    try_step, _ = simulated_limit(99)
    assert find_batch_size(try_step, start=3, max_batch_size=100, safety_margin=0.9) == 89  # floor(99 * 0.9)


def test_a_start_that_already_does_not_fit_is_a_clear_config_error():
    try_step, tried = simulated_limit(8)
    with pytest.raises(ConfigError) as error:
        find_batch_size(try_step, start=16)
    assert error.value.key == "batch_size_finder.start" and "16" in error.value.message
    assert tried == [16]


def test_result_is_at_least_one():
    try_step, _ = simulated_limit(1)
    assert find_batch_size(try_step, start=1, safety_margin=0.5) == 1


# Bad settings (start, max_batch_size, safety_margin) are the schema's to report: tests/unit/config/test_config.py.


# ---- a real step on the CPU, with a memory cap ------------------------------------------------


def mlp_probe():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    images, labels = torch.randn(8, 256), torch.randint(0, 10, (8,))
    return model, training_step_probe(model, (images, labels), backward_step(model, F.cross_entropy))


def measured(probe, batch_size: int) -> int:
    with measure_step_memory("cpu") as measurement:
        probe(batch_size)
    return measurement.peak_bytes


def test_stays_under_a_memory_cap():
    _, probe = mlp_probe()
    cap = 1_000_000  # bytes of activations: 3120 per sample -> 320 samples fit
    result = find_batch_size(
        probe, start=2, max_batch_size=10_000, safety_margin=1.0, memory_cap_bytes=cap, device="cpu"
    )
    assert result == 320
    assert measured(probe, result) <= cap < measured(probe, result + 1)  # the exact boundary
    with_margin = find_batch_size(
        probe, start=2, max_batch_size=10_000, safety_margin=0.9, memory_cap_bytes=cap, device="cpu"
    )
    assert with_margin == int(result * 0.9)


def test_the_search_stops_at_this_ranks_share_of_the_training_split_and_says_so(caplog):
    from trainkit.data.loaders import TensorLoader
    from trainkit.tasks.classification import Classification
    from trainkit.tuning.batch_size_finder import batch_size_that_fits

    torch.manual_seed(0)
    images, labels = torch.randint(0, 256, (101, 1, 8, 8), dtype=torch.uint8), torch.randint(0, 10, (101,))
    # rank 1 of 2: 50 samples an epoch (the odd one out is trimmed, as on every rank)
    loader = TensorLoader(images, labels, batch_size=4, shuffle=True, train=True, rank=1, world_size=2)
    cfg = {"start": 2, "max_batch_size": 4096, "safety_margin": 0.9, "memory_cap_gb": None}
    model, task = SmallCNN(1, 10, widths=(4, 8, 8)), Classification(num_classes=10)
    with caplog.at_level(logging.INFO):

        def step(batch):  # train.py's train_step, in short
            task.step(model, task.transform(batch, lambda images: images.float() / 255))[0].backward()

        found = batch_size_that_fits(model, step, task, loader, CPU, **cfg)
    assert found == 50  # not 4096: a batch larger than a rank's share only makes one short update an epoch
    assert "largest batch size searched (50, the training split per process: 50 of its 101 samples) fits" in caplog.text
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [  # one update an epoch is said, not left to be found in the curves
        "batch size finder: data.batch_size=50 is the whole training split per process: one update an epoch; set "
        "batch_size_finder.max_batch_size to a fraction of 50 for more updates"
    ]


def test_build_run_trains_with_the_size_found_and_every_checkpoint_holds_it(tmp_path, monkeypatch):
    """The search itself is tested above; here its answer is fixed: train.py's loaders batch by it, the resolved
    config (what every checkpoint holds) says it, and the config as composed is left as it was."""
    monkeypatch.setattr(batch_size_finder, "batch_size_that_fits", lambda *args, **settings: 5)
    short = ("device=cpu", "print_config=false", "data.batch_size=8", "data.eval_batch_size=128", "model.widths=[8,16]",
             "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1")  # fmt: skip
    recording = record_run(tmp_path, monkeypatch, *short, "batch_size_finder.enabled=true")
    assert [len(forward.inputs) for forward in recording.training_forwards()] == [5, 5, 5]
    assert recording.run.resolved_config["data"]["batch_size"] == 5 == recording.run.cfg.data.batch_size
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["config"]["data"]["batch_size"] == 5


@pytest.mark.slow  # trains in this process (run_train)
def test_train_py_searches_before_training_and_trains_with_the_size(run_train):
    run = run_train("debug=fast", "batch_size_finder.enabled=true", "batch_size_finder.max_batch_size=128")
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    # On CPU without a cap every size fits: the search stops at max_batch_size, which is used as it is
    # (the safety margin is for memory, not for the cap).
    assert checkpoint["config"]["data"]["batch_size"] == 128


# ---- its config checks, beside its code (trainkit.config.validation gathers them) ------------------------

RULE_CASES = [
    (["batch_size_finder.enabled=yes"], "batch_size_finder.enabled"),
    (["batch_size_finder.start=0"], "batch_size_finder.start"),
    (["batch_size_finder.max_batch_size=0"], "batch_size_finder.max_batch_size"),
    (["batch_size_finder.safety_margin=0"], "batch_size_finder.safety_margin"),
    (["batch_size_finder.safety_margin=1.5"], "batch_size_finder.safety_margin"),
    (["batch_size_finder.memory_cap_gb=0"], "batch_size_finder.memory_cap_gb"),
]
RELATION_CASES = [
    (["batch_size_finder.start=64", "batch_size_finder.max_batch_size=32"], "batch_size_finder.max_batch_size"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    batch_size_finder, RULE_CASES, RELATION_CASES
)


def test_a_micro_batch_larger_than_the_configured_batch_is_allowed_while_the_batch_is_searched():
    """The core refuses trainer.micro_batch_size above data.batch_size (test_config); with the search on, the
    configured size is only where the search starts, and the size found may be larger: this module says so."""
    overrides = ["data.batch_size=32", "trainer.micro_batch_size=48"]
    assert "trainer.micro_batch_size" in problems(composed(*overrides))
    assert problems(composed(*overrides, "batch_size_finder.enabled=true")) == {}
