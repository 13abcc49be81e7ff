"""LR schedules as plain functions (trainkit.schedules): a schedule of your own as one function and one yaml,
checked by the rules it declares beside it (the schedules beyond cosine and constant: test_more_schedules.py)."""

import subprocess

import pytest

from conftest import ROOT, composed
from helpers import nothing_left
from trainkit.checkpointing.files import upgrade_config
from trainkit.config.validation import problems

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
    assert nothing_left(refused.run_dir)
    assert subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout == status


def test_a_key_the_schedule_does_not_take_is_refused_naming_its_arguments():
    assert problems(composed("scheduler=constant", "+scheduler.min_lr_ratio=0.1")) == {
        "scheduler.min_lr_ratio": "is not an argument of trainkit.schedules.constant, which takes warmup_epochs, "
        "warmup_start_factor; remove it (~scheduler.min_lr_ratio) or pick a schedule that takes it"
    }


def test_a_checkpoint_written_when_schedules_had_names_resumes_with_the_function_of_that_name():
    config = {"scheduler": {"name": "cosine", "min_lr_ratio": 0.1}}
    upgrade_config(config)
    assert config == {"scheduler": {"_target_": "trainkit.schedules.cosine", "min_lr_ratio": 0.1}}
