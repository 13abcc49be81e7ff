"""One GPU per sweep trial, with a faked device count: trials running at once never share a GPU."""

import multiprocessing
import os

import pytest
import torch

from conftest import run_here
from helpers import assert_one_config_error, cfg_for
from trainkit.errors import ConfigError
from trainkit.tuning import trial_gpus


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(trial_gpus, "WAIT_SECONDS", 0.05)


def trial_config(ddp: bool = False, nproc: int | None = None):
    cfg = cfg_for()
    cfg.device = "auto"
    cfg.distributed = {"name": "ddp" if ddp else "none", "nproc_per_node": nproc}
    return cfg


def _trial(sweep_dir, ddp, nproc, all_claimed, results):
    """A sweep job in its own process (forked: the faked device count comes along): what it trains on."""
    cfg = trial_config(ddp, nproc)
    with trial_gpus.gpus_for_this_trial(cfg, sweep_dir, multirun=True):
        results.put(os.environ["CUDA_VISIBLE_DEVICES"] if ddp else cfg.device)
        all_claimed.wait(timeout=30)  # hold the GPUs until every trial has its own


def run_at_once(sweep_dir, trials) -> list[str]:
    context = multiprocessing.get_context("fork")
    all_claimed, results = context.Barrier(len(trials)), context.Queue()
    processes = [context.Process(target=_trial, args=(sweep_dir, *t, all_claimed, results)) for t in trials]
    for process in processes:
        process.start()
    got = sorted(results.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return got


def test_trials_running_at_once_each_get_their_own_gpus(four_gpus, tmp_path):
    assert run_at_once(tmp_path, [(False, None)] * 4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    # DDP trials take distributed.nproc_per_node GPUs each, handed to their workers: disjoint sets.
    ddp = run_at_once(tmp_path, [(True, 2), (True, 2)])
    assert sorted(ddp) == ["0,1", "2,3"]
    # A trial that finds every GPU claimed waits for one; a finished trial's claim is gone.
    with trial_gpus.claimed(tmp_path / ".gpus", 4, 3) as held:
        assert held == [0, 1, 2]
        assert run_at_once(tmp_path, [(False, None)]) == ["cuda:3"]


def test_a_ddp_trial_wanting_more_gpus_than_the_machine_has_is_one_line(four_gpus, tmp_path):
    too_many = trial_gpus.gpus_for_this_trial(trial_config(ddp=True, nproc=5), tmp_path, multirun=True)
    with pytest.raises(ConfigError, match=r"distributed.nproc_per_node: is 5: .* this machine has 4; set"):
        too_many.__enter__()


def test_a_trial_of_any_strategy_that_starts_several_processes_claims_one_gpu_a_process(four_gpus, tmp_path):
    """Not only ddp: every distributed option but none starts nproc_per_node processes (a strategy of its own,
    distributed.parallel, is launched as ddp is), and each needs a GPU."""
    cfg = trial_config(nproc=2)
    cfg.distributed.name = "a_strategy_of_its_own"
    with trial_gpus.gpus_for_this_trial(cfg, tmp_path, multirun=True):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and cfg.device == "auto"
    cfg.distributed.nproc_per_node = 5
    with pytest.raises(ConfigError, match=r"distributed.nproc_per_node: is 5: .* this machine has 4; set"):
        trial_gpus.gpus_for_this_trial(cfg, tmp_path, multirun=True).__enter__()


def test_no_gpus_are_assigned_outside_a_parallel_multirun(four_gpus, tmp_path):
    for multirun, overrides in [(False, {}), (True, {"device": "cuda:2"}), (True, {"sweep": {"assign_gpus": False}})]:
        cfg = trial_config()
        cfg.merge_with(overrides)
        device = cfg.device
        with trial_gpus.gpus_for_this_trial(cfg, tmp_path, multirun=multirun):
            assert cfg.device == device


def test_sweep_assign_gpus_is_checked_beside_its_code():
    assert_one_config_error(["sweep.assign_gpus=2"], "sweep.assign_gpus")


def test_each_trial_of_a_multirun_claims_its_gpus(tmp_path, monkeypatch):
    """train.py's call site: every trial goes through the claim (none here: no GPU)."""
    claims = []
    claim = trial_gpus.gpus_for_this_trial
    monkeypatch.setattr(trial_gpus, "gpus_for_this_trial", lambda cfg: claims.append(cfg.seed) or claim(cfg))
    sweep = ("debug=fast", "trainer.max_epochs=1", "print_config=false", f"hydra.sweep.dir={tmp_path}")
    code, _, err = run_here("train.py", "-m", *sweep, "seed=1,2")
    assert code == 0, err[-3000:]
    assert claims == [1, 2]
