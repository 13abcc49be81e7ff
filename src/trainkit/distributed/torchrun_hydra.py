"""Hydra under torchrun: every rank composes the config, but they must share one run directory and only rank 0 may
write Hydra's files into it. trainkit.cli.run calls these before Hydra starts (the `launch_time` resolver, the agreed
launch time, this rank's overrides); processes that train.py starts itself run Hydra once, in the parent."""

import datetime
import os
import time

import torch.distributed as dist

LAUNCH_TIME_VARIABLE = "TRAINKIT_LAUNCH_TIME"


def agree_on_launch_time() -> None:
    """Under torchrun every rank runs Hydra, which names the run directory after the clock. Rank 0
    publishes its clock through torchrun's own store, so every rank names the same directory."""
    env = os.environ
    if LAUNCH_TIME_VARIABLE in env or "TORCHELASTIC_RUN_ID" not in env or int(env.get("WORLD_SIZE", 1)) == 1:
        return
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return  # no store we may join before the process group exists: each rank keeps its own clock
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=120)
    )
    key = f"trainkit/launch_time/{env.get('TORCHELASTIC_RESTART_COUNT', 0)}"
    if env["RANK"] == "0":
        store.set(key, str(time.time()))
    env[LAUNCH_TIME_VARIABLE] = store.get(key).decode()


def launch_time(pattern: str) -> str:
    """`${launch_time:%Y-%m-%d}` in the config: the agreed launch time under torchrun, else now."""
    stamp = float(os.environ.get(LAUNCH_TIME_VARIABLE, time.time()))
    return datetime.datetime.fromtimestamp(stamp).strftime(pattern)


def hydra_overrides_for_this_rank() -> list[str]:
    """Under torchrun, ranks other than 0 still compose the config but write nothing of Hydra's:
    no .hydra/ folder and no log file in the shared run directory."""
    if int(os.environ.get("RANK", 0)) == 0:
        return []
    return ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
