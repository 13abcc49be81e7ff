"""trainkit.data.loader_settings: `auto` worker counts and pinned memory, resolved for this process."""

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from trainkit.data import loader_settings
from trainkit.data.loader_settings import (
    MAX_AUTO_WORKERS,
    auto_num_workers,
    available_cores,
    file_loader_settings,
    resolve_num_workers,
    resolve_pin_memory,
)
from trainkit.data.loaders import FileLoader

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"


@pytest.mark.parametrize(
    "cores, local_ranks, expected",
    [
        (2, 1, 1),  # one core for the training process, one worker decoding
        (1, 1, 1),  # at least one worker: decoding overlaps the step
        (6, 1, 5),
        (16, 2, 7),  # the cores are shared among the ranks of this node
        (16, 8, 1),
        (4, 8, 1),  # fewer cores than ranks: still one each
        (64, 1, MAX_AUTO_WORKERS),  # capped
    ],
)
def test_auto_workers_share_the_cores_among_local_ranks_and_are_capped(cores, local_ranks, expected):
    assert auto_num_workers(cores, local_ranks) == expected


def test_auto_reads_the_affinity_mask_and_the_local_world_size(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7, 8}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)  # the machine's count is not what this process may use
    assert available_cores() == 9
    assert resolve_num_workers("auto") == 8  # 9 cores, 1 rank: all but one
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # torchrun: 3 ranks on this node
    assert resolve_num_workers("auto") == 2  # 9 // 3 - 1
    assert resolve_num_workers(5) == 5 and resolve_num_workers(0) == 0  # explicit numbers are kept


def test_without_an_affinity_mask_the_cpu_count_is_used(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert available_cores() == 4


def test_pin_memory_auto_is_on_with_cuda_only():
    assert resolve_pin_memory("auto", torch.device("cuda", 0)) is True
    assert resolve_pin_memory("auto", torch.device("cpu")) is False
    assert resolve_pin_memory(True, torch.device("cpu")) is True
    assert resolve_pin_memory(False, torch.device("cuda")) is False


def test_the_imagefolder_defaults_resolve_and_reach_the_data_loader(monkeypatch):
    monkeypatch.setattr(loader_settings, "available_cores", lambda: 4)
    cfg = OmegaConf.load(CONF / "imagefolder.yaml")
    assert cfg.num_workers == "auto" and cfg.pin_memory == "auto"
    settings = file_loader_settings(cfg, torch.device("cpu"))
    assert settings == {"num_workers": 3, "pin_memory": False, "prefetch_factor": 2}
    loader = FileLoader(list(range(8)), 4, shuffle=False, **{**settings, "num_workers": 1, "prefetch_factor": 3})
    assert (loader.loader.num_workers, loader.loader.prefetch_factor, loader.loader.pin_memory) == (1, 3, False)
    # Without workers, prefetching means nothing (and torch refuses a prefetch_factor then).
    assert FileLoader(list(range(8)), 4, shuffle=False, num_workers=0, prefetch_factor=3).loader.prefetch_factor is None
