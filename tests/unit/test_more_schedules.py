"""The schedules beyond the core's cosine and constant (trainkit.more_schedules, the `schedules` row of
docs/features.md): step, cosine with warm restarts and warmup-stable-decay, their checks and notices."""

import itertools
import math

import pytest
import torch
from omegaconf import OmegaConf
from test_optim import load_conf, schedule_of
from torch import nn

from conftest import ROOT, composed
from trainkit import schedules
from trainkit.checkpointing.files import upgrade_config
from trainkit.config.validation import problems
from trainkit.schedules import build_scheduler

CONF = ROOT / "conf"


def wsd_by_hand(update: int, warmup: int, total: int, decay: int, shape: str, floor: float) -> float:
    """Warmup-stable-decay, written out: (u + 1) / warmup, then 1, then the decay over the last `decay` updates."""
    if update < warmup:
        return (update + 1) / warmup
    if update < total - decay:
        return 1.0
    progress = (update - (total - decay)) / decay
    fall = {"linear": 1 - progress, "cosine": (1 + math.cos(math.pi * progress)) / 2, "1-sqrt": 1 - math.sqrt(progress)}
    return floor + (1 - floor) * fall[shape]


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_lr_is_the_formula_at_every_update(shape):
    """30 updates (10 an epoch), warmup 5 updates (0.5 epochs), the last 30% (9 updates) decaying to 0.1 x lr."""
    cfg = OmegaConf.load(CONF / "scheduler" / "wsd.yaml")
    cfg.merge_with({"warmup_epochs": 0.5, "decay_fraction": 0.3, "decay_shape": shape, "min_lr_ratio": 0.1})
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.4)
    scheduler = build_scheduler(optimizer, cfg, updates_per_epoch=10, total_updates=30)
    lrs = []
    for _ in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.4 * wsd_by_hand(u, 5, 30, 9, shape, 0.1) for u in range(30)], rel=1e-12)
    assert lrs[4] == lrs[5] == lrs[20] == pytest.approx(0.4) and lrs[21] == pytest.approx(0.4)  # the decay's start
    assert lrs[22] < 0.4 and optimizer.param_groups[0]["lr"] == pytest.approx(0.04)  # min_lr_ratio after the last


@pytest.mark.slow  # trains in this process (run_train)
def test_a_wsd_run_logs_the_formulas_lr_at_every_update(run_train):
    """A short run of scheduler=wsd (2 epochs of 5 updates): the LR logged after each update is the formula's for
    the next, from the run's own totals."""
    run = run_train("scheduler=wsd", "scheduler.warmup_epochs=0.4", "scheduler.decay_fraction=0.5",
                    "scheduler.decay_shape=1-sqrt", "trainer.max_epochs=2", "trainer.limit_train_batches=5",
                    "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "print_config=false")  # fmt: skip
    logged = {m["step"]: m["lr"] for m in run.metrics if "train/step_loss" in m}
    assert sorted(logged) == list(range(1, 11))
    assert logged == pytest.approx({s: 0.1 * wsd_by_hand(s, 2, 10, 5, "1-sqrt", 0.0) for s in range(1, 11)}, rel=1e-12)


def test_cosine_restarts_jump_back_to_one_with_growing_cycles():
    cfg = load_conf("scheduler", "cosine_restarts")  # cycle_epochs 5, cycle_mult 2, no warmup
    assert (cfg.cycle_epochs, cfg.cycle_mult, cfg.warmup_epochs) == (5, 2, 0)
    schedule = schedule_of(cfg, updates_per_epoch=10, total_updates=1000)
    boundaries = [0, 50, 150, 350]  # cycles of 50, 100, 200 updates
    for start, end in itertools.pairwise(boundaries):
        length = end - start
        assert schedule(start) == pytest.approx(1.0)
        assert schedule(start + length // 2) == pytest.approx(0.5)
        assert schedule(end - 1) < 0.01
        assert schedule(end) == pytest.approx(1.0)


def test_step_multiplies_by_gamma_every_step_epochs():
    cfg = load_conf("scheduler", "step")  # step_epochs 10, gamma 0.1
    schedule = schedule_of(cfg, updates_per_epoch=4, total_updates=200)
    step = cfg.step_epochs * 4
    assert [schedule(u) for u in (0, step - 1)] == pytest.approx([1.0, 1.0])
    assert [schedule(u) for u in (step, 2 * step - 1)] == pytest.approx([cfg.gamma, cfg.gamma])
    assert schedule(2 * step) == pytest.approx(cfg.gamma**2)
    assert schedule(3 * step + 1) == pytest.approx(cfg.gamma**3)


@pytest.mark.parametrize(
    "name, total, warned",
    [("step", 40, True), ("step", 41, False), ("cosine_restarts", 8, False), ("cosine_restarts", 24, True)],
)
def test_a_schedule_that_cannot_lower_the_lr_in_the_run_warns_once(caplog, monkeypatch, name, total, warned):
    """step_epochs=10 at 4 updates an epoch: the first drop is update 40, which a 40-update run never reaches.
    A cosine_restarts cycle longer than the run is still a cosine: no warning; a run that ends 4 updates after a
    restart (cycles of 20 updates, then 40) ends near the peak LR: one line naming the keys and the epochs to end on."""
    monkeypatch.setattr(schedules, "_warned", set())
    optimizer = torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="trainkit.schedules"):
        for _ in range(2):  # rebuilt (an applied LR range test rebuilds it): still one warning
            build_scheduler(optimizer, load_conf("scheduler", name), updates_per_epoch=4, total_updates=total)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == int(warned), warnings
    if warned and name == "step":
        assert "scheduler=step never lowers the LR" in warnings[0] and "scheduler.step_epochs" in warnings[0]
    if warned and name == "cosine_restarts":
        assert warnings[0] == (
            "scheduler=cosine_restarts ends this run at 99% of the peak LR: its last cycle restarted at the peak 4 "
            "updates before the end (scheduler.cycle_epochs=5, cycle_mult=2); end on a cycle's end, "
            "trainer.max_epochs=5 or 15, or use scheduler=cosine"
        )


CASES = [
    (["scheduler=cosine_restarts", "scheduler.cycle_epochs=0"], "scheduler.cycle_epochs"),
    (["scheduler=cosine_restarts", "scheduler.cycle_mult=1.5"], "scheduler.cycle_mult"),
    (["scheduler=step", "scheduler.step_epochs=0"], "scheduler.step_epochs"),
    (["scheduler=step", "scheduler.gamma=2"], "scheduler.gamma"),
    (["scheduler=wsd", "scheduler.decay_fraction=1.5"], "scheduler.decay_fraction"),
    (["scheduler=wsd", "scheduler.decay_shape=sqrt"], "scheduler.decay_shape"),
]


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_each_schedules_rules_find_its_mistake_alone(overrides, key):
    assert list(problems(composed(*overrides))) == [key]


def test_a_key_the_schedule_does_not_take_is_refused_naming_its_arguments():
    assert problems(composed("scheduler=step", "+scheduler.min_lr_ratio=0.1")) == {
        "scheduler.min_lr_ratio": "is not an argument of trainkit.more_schedules.step, which takes warmup_epochs, "
        "warmup_start_factor, step_epochs, gamma; remove it (~scheduler.min_lr_ratio) or pick a schedule that takes it"
    }


def test_a_checkpoint_from_before_the_schedules_moved_resumes_with_the_function_where_it_is_now():
    by_name = {"scheduler": {"name": "cosine_restarts", "cycle_epochs": 5}}
    upgrade_config(by_name)
    assert by_name == {"scheduler": {"_target_": "trainkit.more_schedules.cosine_restarts", "cycle_epochs": 5}}
    by_target = {"scheduler": {"_target_": "trainkit.schedules.wsd", "decay_fraction": 0.2}}
    upgrade_config(by_target)
    assert by_target == {"scheduler": {"_target_": "trainkit.more_schedules.wsd", "decay_fraction": 0.2}}
