"""trainkit.data.loader_settings: the articles' loader rules; `auto` worker counts and pinned memory."""

import logging
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers import needs_image_folders
from trainkit.data import loader_settings
from trainkit.data.loader_settings import (
    available_cores,
    cores_per_rank,
    file_loader_settings,
    resolve_num_workers,
    resolve_pin_memory,
)
from trainkit.data.loaders import FileLoader

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"


@pytest.mark.parametrize(
    "cores, local_ranks, expected",
    [
        (8, 1, 8),  # the articles: 8 cores, 8 workers
        (12, 1, 12),
        (32, 1, 32),  # no cap below the cores
        (1, 1, 1),
        (16, 2, 8),  # the cores are shared among the ranks of this node
        (16, 8, 2),
        (9, 2, 4),
        (4, 8, 1),  # fewer cores than ranks: still one each (decoding then overlaps the step)
    ],
)
def test_auto_is_1x_the_cores_of_this_rank_at_least_1(cores, local_ranks, expected):
    assert cores_per_rank(cores, local_ranks) == expected


def test_auto_reads_the_affinity_mask_and_the_local_world_size(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)  # the machine's count is not what this process may use
    assert available_cores() == 12
    assert resolve_num_workers("auto") == 12  # 12 cores, 1 rank: 1x
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 ranks on this node
    assert resolve_num_workers("auto") == 3  # 12 // 4
    assert resolve_num_workers(5) == 5 and resolve_num_workers(0) == 0  # explicit numbers are kept


def test_without_an_affinity_mask_auto_uses_the_cpu_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6 and resolve_num_workers("auto") == 6


def test_pin_memory_auto_is_on_with_cuda_only():
    assert resolve_pin_memory("auto", torch.device("cuda", 0)) is True
    assert resolve_pin_memory("auto", torch.device("cpu")) is False
    assert resolve_pin_memory(True, torch.device("cpu")) is True
    assert resolve_pin_memory(False, torch.device("cuda")) is False


@needs_image_folders
def test_the_imagefolder_defaults_resolve_reach_the_data_loader_and_are_logged(monkeypatch, caplog):
    monkeypatch.setattr(loader_settings, "available_cores", lambda: 4)
    cfg = OmegaConf.load(CONF / "imagefolder.yaml")
    assert cfg.num_workers == "auto" and cfg.pin_memory == "auto"
    with caplog.at_level(logging.INFO, logger="trainkit.data.loader_settings"):
        settings = file_loader_settings(cfg, torch.device("cpu"))
        file_loader_settings(cfg, torch.device("cuda"))  # only resolved: nothing is put on the device
    assert settings == {"num_workers": 4, "pin_memory": False, "prefetch_factor": 2}
    assert caplog.messages == [
        "data: 4 workers per rank, not pinned (data.num_workers=auto, data.pin_memory=auto)",
        "data: 4 workers per rank, pinned (data.num_workers=auto, data.pin_memory=auto)",
    ]
    loader = FileLoader(list(range(8)), 4, shuffle=False, **{**settings, "num_workers": 1, "prefetch_factor": 3})
    assert (loader.loader.num_workers, loader.loader.prefetch_factor, loader.loader.pin_memory) == (1, 3, False)
    # Without workers, prefetching means nothing (and torch refuses a prefetch_factor then).
    assert FileLoader(list(range(8)), 4, shuffle=False, num_workers=0, prefetch_factor=3).loader.prefetch_factor is None
