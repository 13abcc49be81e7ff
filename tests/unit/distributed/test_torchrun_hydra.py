"""Hydra under torchrun: the ranks agree on one launch time (so one run directory) through
torchrun's store, and ranks > 0 write none of Hydra's files. End to end: test_distributed.py's
torchrun tests."""

import datetime
import os
import socket

import pytest
import torch.distributed as dist

from trainkit.distributed.torchrun_hydra import (
    LAUNCH_TIME_VARIABLE,
    agree_on_launch_time,
    hydra_overrides_for_this_rank,
    launch_time,
)

TORCHRUN_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "WORLD_SIZE",
    "RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    LAUNCH_TIME_VARIABLE,
)


@pytest.fixture
def env(monkeypatch):
    """The torchrun variables unset during the test, and unset again after it: what the code under
    test writes into os.environ itself (agree_on_launch_time's launch time) must not reach the
    subprocesses of later tests (two multiruns would then share one launch-time directory)."""
    unset_before = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    for name in unset_before:
        os.environ.pop(name, None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_time_formats_the_agreed_time_else_now(env):
    stamp = datetime.datetime(2026, 1, 2, 3, 4, 5).timestamp()
    env.setenv(LAUNCH_TIME_VARIABLE, str(stamp))
    assert launch_time("%Y-%m-%d_%H-%M-%S") == "2026-01-02_03-04-05"
    env.delenv(LAUNCH_TIME_VARIABLE)
    assert launch_time("%Y") == str(datetime.datetime.now().year)


def test_only_rank_0_writes_hydra_files(env):
    assert hydra_overrides_for_this_rank() == []
    env.setenv("RANK", "0")
    assert hydra_overrides_for_this_rank() == []
    env.setenv("RANK", "3")
    assert hydra_overrides_for_this_rank() == [
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]


def test_outside_torchrun_each_process_keeps_its_own_clock(env):
    agree_on_launch_time()
    env.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun, but without the agent's store to join
    env.setenv("WORLD_SIZE", "2")
    agree_on_launch_time()
    assert LAUNCH_TIME_VARIABLE not in os.environ


def test_ranks_read_rank_0s_clock_from_the_agent_store(env):
    port = free_port()
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )  # what torchrun's agent holds
    for name, value in (
        ("TORCHELASTIC_RUN_ID", "x"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(port)),
    ):
        env.setenv(name, value)
    env.setenv("RANK", "0")
    agree_on_launch_time()
    published = os.environ[LAUNCH_TIME_VARIABLE]
    assert store.get("trainkit/launch_time/0").decode() == published
    del os.environ[LAUNCH_TIME_VARIABLE]  # not env.delenv: monkeypatch would put the value back after the test
    env.setenv("RANK", "1")
    agree_on_launch_time()
    assert os.environ[LAUNCH_TIME_VARIABLE] == published
