"""One GPU per sweep trial: parallel jobs of a multirun on one machine never share a GPU.

    python train.py -m hydra/launcher=joblib hydra.launcher.n_jobs=4 optimizer.lr=0.1,0.05,0.02,0.01

With G >= 2 visible GPUs, each job claims free GPUs before it trains (`sweep.assign_gpus`): one, or
`distributed.nproc_per_node` (null: all G); more than G is refused. A job waits while none are free. The claim is an
flock on `<sweep dir>/.gpus/<index>.lock`: independent of the launcher, dropped by the kernel when its holder dies, and
naming its holder.

A one-process trial trains on `device=cuda:<index>` (a reused worker may have touched CUDA already); a multi-process
trial sets its workers' CUDA_VISIBLE_DEVICES. Nothing is assigned under torchrun, SLURM or submitit, with fewer than two
GPUs, or with an explicit `device=cuda:N`. Sweeps in different directories do not see each other's claims.
"""

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

import torch
from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.resume import in_multirun
from trainkit.config.schema import flag
from trainkit.distributed.process_group import launched_externally
from trainkit.errors import ConfigError

log = logging.getLogger("sweep")
WAIT_SECONDS = 1.0  # between looks for a free GPU, while every one is claimed
CONFIG_RULES = {"sweep.assign_gpus": flag()}  # gathered by the config check: conf/config.yaml's sweep._checks_
Result = TypeVar("Result")


def on_its_own_gpus(trial: Callable[[DictConfig], Result]) -> Callable[[DictConfig], Result]:
    """`trial(cfg)` run inside gpus_for_this_trial(cfg): train.py's one call site."""

    def claiming(cfg: DictConfig) -> Result:
        with gpus_for_this_trial(cfg):
            return trial(cfg)

    return claiming


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them."""
    count = torch.cuda.device_count()
    listed = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    return listed[:count] if len(listed) >= count else [str(index) for index in range(count)]


@contextlib.contextmanager
def gpus_for_this_trial(cfg: DictConfig, sweep_dir: Path | None = None, multirun: bool | None = None) -> Iterator[None]:
    """Within: this trial's own GPUs (see the module). `sweep_dir` and `multirun` come from Hydra when None."""
    multirun = in_multirun() if multirun is None else multirun
    if not _assigns(cfg, multirun):
        yield
        return
    gpus = visible_gpus()
    several = cfg.distributed.name != "none"  # every other strategy starts nproc_per_node processes (local_launch.py)
    wanted = (cfg.distributed.nproc_per_node or len(gpus)) if several else 1
    if wanted > len(gpus):
        raise ConfigError(
            "distributed.nproc_per_node",
            f"is {wanted}: a trial of this sweep takes {wanted} GPUs but this machine has {len(gpus)}; "
            f"set distributed.nproc_per_node<={len(gpus)}",
        )
    if sweep_dir is None:
        from hydra.core.hydra_config import HydraConfig

        sweep_dir = Path(HydraConfig.get().sweep.dir)
    with claimed(sweep_dir / ".gpus", len(gpus), wanted) as indices:
        names = [gpus[index] for index in indices]
        log.info(f"this trial trains on GPU {','.join(names)} (claimed in {sweep_dir / '.gpus'}; sweep.assign_gpus)")
        if not several:
            cfg.device = f"cuda:{indices[0]}"
            yield
            return
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(names)  # the workers, started now, see these alone
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before


def _assigns(cfg: DictConfig, multirun: bool) -> bool:
    if not multirun or not OmegaConf.select(cfg, "sweep.assign_gpus", default=True):
        return False
    if launched_externally() or os.environ.get("SUBMITIT_EXECUTOR"):
        return False  # torchrun/SLURM tasks have their devices; a submitit job has its own allocation
    return cfg.device in ("auto", "cuda") and torch.cuda.device_count() >= 2


@contextlib.contextmanager
def claimed(lock_dir: Path, count: int, wanted: int) -> Iterator[list[int]]:
    """`wanted` of the indices 0..count-1 that no other process holds, held within; all or none, so two trials
    cannot block each other."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    waiting_said = False
    while True:
        held: list[tuple[int, IO[str]]] = []
        for index in range(count):
            file: IO[str] = open(lock_dir / f"{index}.lock", "a+")  # noqa: SIM115  # closed below, or when released
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                continue
            held.append((index, file))
            if len(held) == wanted:
                break
        if len(held) == wanted:
            break
        for _, file in held:
            file.close()  # closing drops the flock
        if not waiting_said:
            log.info(f"waiting for {wanted} free GPU{'s' if wanted > 1 else ''} (every one is claimed in {lock_dir})")
            waiting_said = True
        time.sleep(WAIT_SECONDS)
    try:
        for _, file in held:
            file.seek(0)
            file.truncate()
            file.write(f"process {os.getpid()}\n")
            file.flush()
        yield [index for index, _ in held]
    finally:
        for _, file in held:
            file.close()
