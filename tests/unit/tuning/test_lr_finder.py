"""LR range test: a sane suggestion on a problem whose good LRs are known, early stop on divergence,
every piece of state put back bit for bit, group scales respected, the script, DDP."""

import json
import logging
import math
import os
import random
import signal
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from conftest import ROOT, composed, run_here
from helpers import backward_step, config_check_tests, spawn_ranks, template_has
from trainkit.checkpointing import signals
from trainkit.config.validation import validate
from trainkit.models.small_cnn import SmallCNN
from trainkit.optim import build_optimizer
from trainkit.schedules import build_scheduler, lr_schedule
from trainkit.tasks.task import Task
from trainkit.tuning import lr_finder
from trainkit.tuning.lr_finder import group_scales, lr_range_test, set_base_lr, suggest_lr

CONF = ROOT / "conf"
SIGNALLED_RUN = ("augmentation=shift", "trainer.progress_bar=false", "print_config=false")  # stopped before training
CPU = torch.device("cpu")
TASK = Task()  # (inputs, targets) batches, weighed by their samples: what the finder moves and weighs


def mse(prediction, target):
    return F.mse_loss(prediction.squeeze(-1), target)


def regression_batches(seed: int, dim: int = 10, samples: int = 2048, batch_size: int = 64):
    """y = x.w + noise with x ~ N(0, I): the loss's Hessian is about 2 I, so plain SGD converges
    fast for lr in ~0.1-0.5 and diverges above ~1 (lr > 2 / largest curvature)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(dim, generator=generator)
    x = torch.randn(samples, dim, generator=generator)
    y = x @ weights + 0.1 * torch.randn(samples, generator=generator)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, samples, batch_size)]


def final_loss_after_training(seed: int, lr: float, batches, steps: int = 30) -> float:
    torch.manual_seed(seed)
    model = nn.Linear(batches[0][0].shape[1], 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches[:steps]:
        optimizer.zero_grad()
        mse(model(x), y).backward()
        optimizer.step()
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    return mse(model(x), y).item()


# ---- the suggestion ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_suggestion_on_linear_regression_is_in_the_known_good_band(seed):
    batches = regression_batches(seed)
    torch.manual_seed(seed)
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = lr_range_test(
        model, optimizer, backward_step(model, mse), TASK, batches, CPU, min_lr=1e-4, max_lr=10.0, num_steps=100
    )
    # Band [0.03, 0.5]: 30 SGD steps at either end bring the loss (about 10 at the start) below 0.5;
    # 0.01 is too slow, above ~1 SGD diverges. The rule lands at the start of the drop (~0.05-0.1).
    assert 0.03 <= result.suggestion <= 0.5
    assert final_loss_after_training(seed, result.suggestion, batches) < 0.5
    assert final_loss_after_training(seed, 0.01, batches) > 1.0
    # SGD diverges on this problem above lr ~1, so a sweep to 10 stops there.
    assert result.stopped_early and 0.7 < result.lrs[-1] < 10
    assert len(result.lrs) == len(result.losses) == len(result.raw_losses) < 100


def test_huge_max_lr_stops_early_once_the_smoothed_loss_is_four_times_the_best():
    batches = regression_batches(0)
    torch.manual_seed(0)
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = lr_range_test(
        model, optimizer, backward_step(model, mse), TASK, batches, CPU, min_lr=1e-3, max_lr=1e6, num_steps=200
    )
    assert result.stopped_early
    last, best = result.losses[-1], min(result.losses[:-1])
    assert not math.isfinite(last) or last > 4.0 * best
    assert all(v <= 4.0 * min(result.losses[: i + 1]) for i, v in enumerate(result.losses[:-1]))
    assert result.lrs[-1] < 1e3  # stopped long before max_lr


def test_lrs_are_an_exponential_sweep_from_min_to_max():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    batches = [(torch.zeros(4, 2), torch.zeros(4))]  # zero loss: never diverges
    result = lr_range_test(
        model, optimizer, backward_step(model, mse), TASK, batches, CPU, min_lr=1e-3, max_lr=1e1, num_steps=5
    )
    assert result.lrs == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    assert not result.stopped_early


def test_suggest_lr_rule_on_hand_made_curves():
    lrs = list(np.logspace(-5, 1, 61))
    x = np.log10(lrs)
    falling = list(2.0 - np.tanh(2 * (x + 2)))  # steepest at lr = 1e-2, flat after
    assert suggest_lr(lrs, falling) == pytest.approx(1e-2, rel=0.3)
    diverging = falling[:45] + [falling[44] * 1.5**k for k in range(1, 16)]
    assert suggest_lr(lrs, diverging) == pytest.approx(1e-2, rel=0.3)  # points after the minimum are out
    rising = list(1.0 + x)
    assert suggest_lr(lrs, rising) is None  # the loss never fell
    assert suggest_lr(lrs[:2], falling[:2]) is None
    with_nan = falling[:30] + [math.nan] * 31
    assert suggest_lr(lrs, with_nan) == suggest_lr(lrs[:30], falling[:30])  # the curve up to the first non-finite value


# Bad lr_finder.* settings are config errors found before anything is built: tests/unit/config/test_config.py.


# ---- state restored bit for bit ---------------------------------------------------------------


def all_tensors(obj, prefix=""):
    """Flatten nested state into {path: value} so every tensor and number can be compared."""
    if isinstance(obj, dict):
        items = {}
        for key, value in obj.items():
            items.update(all_tensors(value, f"{prefix}/{key}"))
        return items
    if isinstance(obj, (list, tuple)):
        items = {}
        for index, value in enumerate(obj):
            items.update(all_tensors(value, f"{prefix}/{index}"))
        return items
    return {prefix: obj.clone() if isinstance(obj, torch.Tensor) else obj}  # a copy: state dicts hold live tensors


def assert_identical(before: dict, after: dict):
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a.dtype == b.dtype, key
        else:
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), key


def snapshot(model, optimizer, scheduler):
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "modes": [m.training for m in model.modules()],
        "optimizer": all_tensors(optimizer.state_dict()),
        "scheduler": all_tensors(scheduler.state_dict()),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy(),
    }


@pytest.mark.parametrize("optimizer_name", ["sgd", "adamw"])
def test_model_optimizer_scheduler_and_rng_are_restored_bit_for_bit(optimizer_name):
    torch.manual_seed(0)
    model = SmallCNN(1, 10, widths=(4, 8, 8), dropout=0.2)
    cfg = OmegaConf.load(CONF / "optimizer" / f"{optimizer_name}.yaml")
    cfg.head_lr_scale = 10.0
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, OmegaConf.load(CONF / "scheduler" / "cosine.yaml"), 5, 50)
    images, labels = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    for _ in range(3):  # momentum / Adam moments exist, the schedule has moved
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        scheduler.step()
    F.cross_entropy(model(images), labels).backward()  # leave gradients behind, as a loop might
    model.eval()  # a mode the test must put back (it trains in train mode)
    batches = [(torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))) for _ in range(4)]
    random.random(), np.random.rand()
    before = snapshot(model, optimizer, scheduler)
    result = lr_range_test(
        model,
        optimizer,
        backward_step(model, F.cross_entropy, transform=lambda x: x + 0.01 * torch.randn_like(x)),  # uses the RNG
        TASK,
        batches,
        CPU,
        scheduler=scheduler,
        min_lr=1e-4,
        max_lr=1e4,
        num_steps=30,
    )
    assert len(result.lrs) > 3
    after = snapshot(model, optimizer, scheduler)
    assert_identical(before["model"], after["model"])
    assert_identical(before["grads"], after["grads"])
    assert before["modes"] == after["modes"]
    assert_identical(before["optimizer"], after["optimizer"])
    assert_identical(before["scheduler"], after["scheduler"])
    assert torch.equal(before["torch_rng"], after["torch_rng"])
    assert before["python_rng"] == after["python_rng"]
    assert np.array_equal(before["numpy_rng"], after["numpy_rng"])


def test_restored_even_when_the_loss_raises():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    weights = model.weight.detach().clone()
    calls = []

    def step(batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        loss = model(batch[0]).pow(2).mean()
        loss.backward()
        return loss, 4

    with pytest.raises(RuntimeError, match="boom"):
        lr_range_test(
            model,
            optimizer,
            step,
            TASK,
            [(torch.ones(4, 2), None)],
            CPU,
            min_lr=0.1,
            max_lr=1.0,
            num_steps=10,
        )
    assert torch.equal(model.weight, weights)
    assert optimizer.state_dict()["state"] == {} and optimizer.param_groups[0]["lr"] == 1.0


# ---- parameter groups and applying the suggestion ---------------------------------------------


def test_every_group_keeps_its_scale_during_the_sweep():
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    cfg = OmegaConf.load(CONF / "optimizer" / "sgd.yaml")
    cfg.head_lr_scale = 10.0
    optimizer = build_optimizer(model, cfg)
    assert group_scales(optimizer) == [1.0, 1.0, 10.0, 10.0]
    seen = []

    def step(batch):
        seen.append([group["lr"] for group in optimizer.param_groups])
        return backward_step(model, F.cross_entropy)(batch)

    result = lr_range_test(
        model,
        optimizer,
        step,
        TASK,
        [(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))],
        CPU,
        min_lr=1e-4,
        max_lr=1e-2,
        num_steps=3,
    )
    for lrs, base in zip(seen, result.lrs):
        assert lrs == pytest.approx([base, base, 10 * base, 10 * base])


def test_group_scales_without_lr_scale_keys_are_relative_to_the_first_group():
    a, b = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.5}], lr=0.1)
    assert group_scales(optimizer) == pytest.approx([1.0, 5.0])


def test_set_base_lr_then_rebuilding_the_scheduler_starts_the_schedule_from_the_suggestion():
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    cfg = OmegaConf.load(CONF / "optimizer" / "sgd.yaml")
    cfg.head_lr_scale = 10.0
    optimizer = build_optimizer(model, cfg)
    scheduler_cfg = OmegaConf.load(CONF / "scheduler" / "cosine.yaml")  # 1 warmup epoch
    build_scheduler(optimizer, scheduler_cfg, 4, 40)
    set_base_lr(optimizer, 0.02)
    scheduler = build_scheduler(optimizer, scheduler_cfg, 4, 40)
    schedule, _ = lr_schedule(scheduler_cfg, 4, 40)
    for update in range(10):
        lrs = [group["lr"] for group in optimizer.param_groups]
        assert lrs == pytest.approx([0.02 * schedule(update)] * 2 + [0.2 * schedule(update)] * 2)
        optimizer.step()
        scheduler.step()


# ---- the script --------------------------------------------------------------------------------


@pytest.mark.slow  # trains for 20 steps
def test_lr_find_script_composes_the_train_config_and_writes_its_outputs(tmp_path):
    run_dir = tmp_path / "run"
    returncode, stdout, stderr = run_here(
        "scripts/lr_find.py",
        f"hydra.run.dir={run_dir}",
        "model.widths=[4,8,8]",
        "optimizer.head_lr_scale=2",
        "++lr_finder.num_steps=20",
        "++lr_finder.min_lr=1e-4",
    )
    assert returncode == 0, stderr[-3000:]
    assert "suggested optimizer.lr=" in stdout + stderr
    saved = json.loads((run_dir / "lr_finder.json").read_text())
    assert len(saved["lrs"]) <= 20 and saved["settings"]["num_steps"] == 20
    assert (run_dir / "lr_finder.png").read_bytes()[:4] == b"\x89PNG"


def test_lr_find_script_sweeps_the_task_s_own_training_loss(tmp_path):
    # A task with its own loss (ten times the cross-entropy): the curve is that loss, not a cross-entropy.
    run_dir = tmp_path / "run"
    returncode, _, stderr = run_here(
        "scripts/lr_find.py",
        f"hydra.run.dir={run_dir}",
        "model.widths=[4,8,8]",
        "task._target_=tasks_for_tests.TenfoldLoss",
        "++lr_finder.num_steps=3",
        "++lr_finder.min_lr=1e-6",
        "++lr_finder.max_lr=1e-5",
    )
    saved = json.loads((run_dir / "lr_finder.json").read_text())  # written before the suggestion is judged
    # 10 digits at initialization: cross-entropy ~ln(10) = 2.3, so the task's loss is ~23
    assert min(saved["raw_losses"]) > 15, (returncode, stderr[-2000:])


@pytest.mark.skipif(not template_has("experiment/stdlib_gpt.yaml"), reason="this clone has no language model (trimmed)")
def test_lr_find_script_builds_and_steps_as_train_py_does_on_token_data(tmp_path):
    # A language model: no image transform to build, a loss per token (it built an image BatchTransform and failed).
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def f(x):\n    return x + 1\n" * 400)  # trains: over a third of the bytes
    (corpus / "b.py").write_text("class A:\n    pass\n" * 200)
    (corpus / "c.py").write_text("import os\nprint(os.sep)\n" * 200)
    run_dir = tmp_path / "run"
    tiny = ("data.block_size=16", "data.batch_size=4", "data.val_fraction=0.34", "data.test_fraction=0.33")
    returncode, _, stderr = run_here(
        "scripts/lr_find.py",
        f"hydra.run.dir={run_dir}",
        "experiment=stdlib_gpt",
        f"data.root={corpus}",
        *tiny,
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=16",
        "++lr_finder.num_steps=8",
    )
    saved = json.loads((run_dir / "lr_finder.json").read_text())
    assert len(saved["lrs"]) == 8, (returncode, stderr[-2000:])
    assert 4.5 < saved["raw_losses"][0] < 6.5  # a mean over tokens, near ln(256) = 5.5 at initialization


def test_lr_find_script_reports_bad_input_in_one_line(tmp_path):
    returncode, _, stderr = run_here("scripts/lr_find.py", f"hydra.run.dir={tmp_path}", "++lr_finder.max_lr=-1")
    assert returncode == 1
    assert stderr.strip().splitlines()[-1].startswith("error: lr_finder.max_lr:")


def test_lr_find_script_help_is_its_own_usage_not_train_py_s(tmp_path):
    returncode, stdout, stderr = run_here("scripts/lr_find.py", "--help", cwd=tmp_path)
    assert returncode == 0, stderr[-3000:]
    assert stdout.startswith("LR range test with the same config as train.py")
    assert "python scripts/lr_find.py experiment=digits" in stdout  # the docstring's usage
    assert "Every train.py override works here; the script writes into outputs/runs/<time>/ like train.py" in (stdout)
    assert "train a model (classification" not in stdout  # train.py's own help header
    assert "== Config groups (group=option) ==" in stdout and "lr_finder:" in stdout
    assert not list(tmp_path.iterdir())  # --help runs nothing and writes no run directory


# ---- a stop signal during the sweep, in train.py ----------------------------------------------------


def test_a_signal_during_the_lr_finder_stops_it_within_a_step_and_saves_nothing(run_train, monkeypatch):
    endless = lr_finder._endless

    def signalled_at_the_fourth_batch(batches):
        for index, batch in enumerate(endless(batches)):
            if index == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # SLURM's warning: little time left
            yield batch

    monkeypatch.setattr(lr_finder, "_endless", signalled_at_the_fourth_batch)
    # (conftest's stop_signals_as_they_were gives this process its handlers back after the stop)
    run = run_train("lr_finder.enabled=true", "lr_finder.num_steps=300", *SIGNALLED_RUN, check=False)
    log = (run.run_dir / "train.log").read_text()
    assert run.returncode == signals.EXIT_STOPPED, (run.stderr + log)[-3000:]
    assert "lr range test: stopped by SIGTERM after 4 of 300 steps" in log
    assert "stopped by SIGTERM during the LR finder, before training: nothing trained or saved (exit code 75)" in log
    assert not (run.run_dir / "checkpoints").exists() and not (run.run_dir / "lr_finder.png").exists()


# ---- DDP: every rank sees the same curve and stops at the same step ----------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, results: str):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # identical initial weights, as DDP would make them
        model = nn.parallel.DistributedDataParallel(nn.Linear(10, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = regression_batches(seed=rank)  # each rank its own shard: different losses
        step = backward_step(model, mse)
        result = lr_range_test(model, optimizer, step, TASK, batches, CPU, min_lr=1e-4, max_lr=100.0, num_steps=100)
        torch.save(result.to_dict(), f"{results}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_under_ddp_all_ranks_see_the_same_smoothed_loss_and_stop_together(tmp_path):
    spawn_ranks(_ddp_worker, 2, free_port(), str(tmp_path / "result"))
    rank0, rank1 = (torch.load(tmp_path / f"result.{rank}") for rank in (0, 1))
    assert rank0 == rank1  # the same lrs, losses, suggestion and stop
    assert rank0["stopped_early"] and len(rank0["lrs"]) < 100


# ---- its config checks, beside its code (trainkit.config.validation gathers them) ------------------------

RULE_CASES = [
    (["lr_finder.enabled=yes"], "lr_finder.enabled"),
    (["lr_finder.apply=1"], "lr_finder.apply"),
    (["lr_finder.min_lr=0"], "lr_finder.min_lr"),
    (["lr_finder.max_lr=-1"], "lr_finder.max_lr"),
    (["lr_finder.num_steps=1"], "lr_finder.num_steps"),
    (["lr_finder.smoothing=1"], "lr_finder.smoothing"),
    (["lr_finder.divergence_factor=1"], "lr_finder.divergence_factor"),
]
RELATION_CASES = [
    (["lr_finder.max_lr=1e-8"], "lr_finder.max_lr"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    lr_finder, RULE_CASES, RELATION_CASES
)


def test_apply_without_the_test_is_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="trainkit.config.validation"):
        validate(composed("lr_finder.apply=true"))
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("lr_finder.apply=true is ignored"), warnings
