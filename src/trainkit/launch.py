"""Start N worker processes on this machine from inside a running script (and its Hydra job).

`python train.py distributed=ddp distributed.nproc_per_node=N` uses torch's elastic launch API,
the engine behind torchrun, so a Hydra multirun can start one process group per sweep job. The
workers receive the already composed config and run directory: Hydra runs once, in the parent.
"""
import importlib.util
import logging
import os
import sys
import uuid
from pathlib import Path

import torch
from omegaconf import DictConfig

from trainkit.distributed import ProcessInfo
from trainkit.errors import ConfigError

# The format of conf/config.yaml's hydra.job_logging, for the workers Hydra does not configure.
LOG_FORMAT, LOG_DATE_FORMAT = "[%(asctime)s] %(message)s", "%H:%M:%S"


def _call_script_function(script: str, function: str, *args):
    """Worker entry point: import the script by path and call one of its functions.

    It lives in this module, not in the script, so it pickles by reference whatever launched the
    parent (plain python, a Hydra launcher, joblib's workers).
    """
    spec = importlib.util.spec_from_file_location(f"trainkit_worker_{Path(script).stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(script).parent))
    spec.loader.exec_module(module)
    return getattr(module, function)(*args)


def launch_local_workers(nproc: int, script: str, function: str, *args) -> dict[int, object]:
    """Run `function(*args)` from `script` in `nproc` processes forming one process group.

    Returns {rank: return value}. If any worker fails, the agent stops the others and this raises
    (torch's ChildFailedError names the rank and its error), so a crash never leaves a rank waiting.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc,
        run_id=f"trainkit-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",  # port 0: a free port, as torchrun --standalone
        max_restarts=0, monitor_interval=0.1, start_method="spawn",
    )
    return elastic_launch(config, _call_script_function)(script, function, *args)


def threads_per_worker(local_world_size: int) -> int:
    """CPU threads each local worker may use without oversubscribing the machine's cores."""
    return max(1, (os.cpu_count() or 1) // local_world_size)


def limit_cpu_threads(local_world_size: int) -> None:
    if local_world_size > 1:
        torch.set_num_threads(threads_per_worker(local_world_size))


def processes_per_node(cfg: DictConfig) -> int:
    """`distributed.nproc_per_node`, where null means one process per visible GPU (which only
    this machine can tell, so it is checked here, not by trainkit.config)."""
    if cfg.nproc_per_node is not None:
        return cfg.nproc_per_node
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    raise ConfigError("distributed.nproc_per_node", "is null (one process per GPU) but no GPU is visible; "
                      "set distributed.nproc_per_node=N to run N CPU processes with gloo")


def configure_worker_logging(run_dir: Path, proc: ProcessInfo) -> None:
    """Rank 0 logs to the console and the run's train.log, as the Hydra parent does; other ranks
    report warnings and errors only."""
    handlers = [logging.StreamHandler()]
    if proc.is_main:
        handlers.append(logging.FileHandler(run_dir / "train.log"))
    logging.basicConfig(level=logging.INFO if proc.is_main else logging.WARNING, format=LOG_FORMAT,
                        datefmt=LOG_DATE_FORMAT, handlers=handlers, force=True)
