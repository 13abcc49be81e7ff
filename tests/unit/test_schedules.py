"""LR schedules as plain functions (trainkit.schedules): wsd's formula, and a schedule of your own as one function
and one yaml, checked by the rules it declares beside it."""

import math
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, composed
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


SCHEDULE_OF_YOUR_OWN = '''
from trainkit.config.schema import number


def halving(update, updates_per_epoch, total_updates, every_epochs=1.0):
    """The LR halves every `every_epochs` epochs."""
    return 0.5 ** (update // round(every_epochs * updates_per_epoch))


halving.config_rules = {"every_epochs": number(above=0)}
'''


@pytest.mark.slow  # trains in this process (run_train)
def test_a_schedule_of_your_own_is_one_function_and_one_yaml(run_train, tmp_path, monkeypatch):
    """The function in a module of yours, its yaml in a config folder of yours (hydra.searchpath): nothing in the
    repository is edited, the run follows it, and the rule it declares beside it is the config check's."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_schedules.py").write_text(SCHEDULE_OF_YOUR_OWN)
    (tmp_path / "conf" / "scheduler").mkdir(parents=True)
    (tmp_path / "conf" / "scheduler" / "halving.yaml").write_text("_target_: my_schedules.halving\nevery_epochs: 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    mine = ("scheduler=halving", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "trainer.max_epochs=3",
            "trainer.limit_train_batches=4", "trainer.log_every_n_steps=1", "trainer.progress_bar=false",
            "print_config=false")  # fmt: skip
    run = run_train(*mine)
    logged = {m["step"]: m["lr"] for m in run.metrics if "train/step_loss" in m}
    assert logged == pytest.approx({s: 0.1 * 0.5 ** (s // 4) for s in range(1, 13)}, rel=1e-12)
    refused = run_train(*mine, "scheduler.every_epochs=0", check=False)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and lines == ["error: scheduler.every_epochs: must be a number > 0, got 0"]
    assert not refused.run_dir.exists()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout == status


def test_a_key_the_schedule_does_not_take_is_refused_naming_its_arguments():
    assert problems(composed("scheduler=step", "+scheduler.min_lr_ratio=0.1")) == {
        "scheduler.min_lr_ratio": "is not an argument of trainkit.schedules.step, which takes warmup_epochs, "
        "warmup_start_factor, step_epochs, gamma; remove it (~scheduler.min_lr_ratio) or pick a schedule that takes it"
    }


def test_a_checkpoint_written_when_schedules_had_names_resumes_with_the_function_of_that_name():
    config = {"scheduler": {"name": "cosine_restarts", "cycle_epochs": 5}}
    upgrade_config(config)
    assert config == {"scheduler": {"_target_": "trainkit.schedules.cosine_restarts", "cycle_epochs": 5}}
