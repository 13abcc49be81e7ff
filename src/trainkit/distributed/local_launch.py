"""train.py and eval.py start their own DDP workers: `distributed=ddp distributed.nproc_per_node=N` without torchrun.

A feature (docs/features.md): trainkit.distributed.launch reaches it from a marked line when a run of several processes
finds none started (no torchrun, no SLURM). It uses torch's elastic launch API (torchrun's engine), so a multirun can
start one process group per job; Hydra runs once, in the parent, and the workers get its config and run directory.

The parent passes stop signals on (`forward_to_workers`) instead of torch's agent, which would kill the workers; a
worker's clean stop or failure comes back as rank 0's result and is raised here, as one process would. A ConfigError a
worker finds is written by rank 0 to WORKER_ERROR_ENV's file and raised again by the parent: one line and the run
directory as it was, as for a single process.
"""

import atexit
import contextlib
import importlib.util
import json
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing import signals
from trainkit.checkpointing.signals import (
    STOP_SIGNALS,
    Stopped,
    request,
    stop_if_requested_while_starting,
    stop_on_signals,
)
from trainkit.distributed.process_group import ProcessInfo, exit_now_if_a_process_group_was_joined, process_info
from trainkit.errors import ConfigError, RunFailed
from trainkit.runtime import cores_per_rank

log = logging.getLogger(__name__)

# Where a worker's rank 0 writes the ConfigError it refused the run with, for the parent to raise again.
WORKER_ERROR_ENV = "TRAINKIT_WORKER_CONFIG_ERROR"
# Set by the parent on a stop signal: a worker spawned after it stops too.
STOP_ENV = "TRAINKIT_STOP_REQUESTED"
# torch's lines about a worker that exited 1: noise for a refusal the parent reports in one line.
LAUNCH_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")

# The format of conf/config.yaml's hydra.job_logging, for the workers Hydra does not configure.
LOG_FORMAT, LOG_DATE_FORMAT = "[%(asctime)s] %(message)s", "%H:%M:%S"


def start_workers(cfg: DictConfig, run_dir: Path, train_process: Callable[..., Any]) -> Any:
    """`train_process(cfg, run_dir, proc, device)` in distributed.nproc_per_node worker processes started now, forming
    one process group; rank 0's result. It must be a module-level function of its script."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if train_process.__qualname__ != train_process.__name__:  # a lambda, a nested function: no name to import
        raise TypeError(f"start_workers: {train_process.__qualname__} is not a module-level function of its script")
    nproc = processes_per_node(cfg)
    script, function = train_process.__code__.co_filename, train_process.__name__
    with forward_to_workers():  # from the first second: the workers start with the stop signals blocked
        stop_if_requested_while_starting()  # no worker started yet
        log.info(f"launching {nproc} {cfg.distributed.name.upper()} processes -> {run_dir}")
        try:
            with config_errors_from_workers():
                result = launch_local_workers(nproc, script, function, worker_config(cfg), str(run_dir))[0]
        except ChildFailedError as error:  # a worker failed; it printed its own error
            rank, failure = error.get_first_failure()
            print(
                f"error: DDP worker rank {rank} failed with exit code {failure.exitcode}; its error is printed above",
                file=sys.stderr,
            )
            raise RunFailed(f"DDP worker rank {rank} failed") from error
        if isinstance(result, (Stopped, RunFailed)):  # the workers stopped cleanly and said why (inside: a
            raise result  # stop on submitit's signal then hands over to submitit's requeue)
    return result


def planned_workers(cfg: DictConfig) -> int | None:
    """How many workers start_workers will start (distributed.nproc_per_node; null: one per visible GPU), or None
    where it refuses the setting."""
    nproc = cfg.distributed.get("nproc_per_node")
    if nproc is None:
        return torch.cuda.device_count() or None
    return nproc if isinstance(nproc, int) and not isinstance(nproc, bool) else None


@contextlib.contextmanager
def config_errors_from_workers() -> Iterator[None]:
    """Raise a worker's ConfigError here in place of torch's ChildFailedError, without torch's lines about it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    handle, name = tempfile.mkstemp(prefix="trainkit-worker-error-", suffix=".json")
    os.close(handle)
    error_file = Path(name)

    def not_about_a_refusal(record: logging.LogRecord) -> bool:
        return not (error_file.is_file() and error_file.stat().st_size > 0)

    before = os.environ.get(WORKER_ERROR_ENV)
    os.environ[WORKER_ERROR_ENV] = name  # the spawned workers inherit the environment
    for name_ in LAUNCH_LOGGERS:
        logging.getLogger(name_).addFilter(not_about_a_refusal)
    try:
        yield
    except ChildFailedError:
        refused = json.loads(error_file.read_text() or "null")
        if refused is None:
            raise
        raise ConfigError(refused["key"], refused["message"]) from None
    finally:
        for name_ in LAUNCH_LOGGERS:
            logging.getLogger(name_).removeFilter(not_about_a_refusal)
        if before is None:
            os.environ.pop(WORKER_ERROR_ENV, None)
        else:
            os.environ[WORKER_ERROR_ENV] = before
        error_file.unlink(missing_ok=True)


def worker_config(cfg: DictConfig) -> dict[str, Any]:
    """`cfg` as plain containers for the workers, interpolations unresolved: keys filled once the data is built
    (data.num_classes) must reach those that interpolate them (model.num_classes)."""
    return cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=False))


def launch_local_workers(nproc: int, script: str, function: str, config: dict, run_dir: str) -> dict[int, object]:
    """Run `function(config, run_dir, proc, device)` from `script` in `nproc` processes forming one process group.

    Returns {rank: return value}. If any worker fails, the agent stops the others and this raises ChildFailedError.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch_config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"trainkit-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # port 0: a free port, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        signals_to_handle="SIGQUIT",  # SIGTERM, SIGUSR1, SIGINT, SIGHUP: checkpointing.signals.forward_to_workers
    )
    with _workers_start_with_stop_signals_blocked():
        return elastic_launch(launch_config, _worker)(script, function, config, run_dir)


@contextlib.contextmanager
def _workers_start_with_stop_signals_blocked() -> Iterator[None]:
    """Workers start with the stop signals blocked (the mask survives fork and exec) and unblock them once they listen
    (`_worker`), so a signal while a worker imports torch stops it cleanly. The mask is set only while torch's agent
    starts the workers."""
    import torch.multiprocessing

    start = torch.multiprocessing.start_processes

    def start_processes(*args: Any, **kwargs: Any) -> Any:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return start(*args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # what arrived meanwhile is handled now

    torch.multiprocessing.start_processes = start_processes
    try:
        yield
    finally:
        torch.multiprocessing.start_processes = start


def _worker(script: str, function: str, config: dict, run_dir: str) -> Any:
    """Each worker's entry point: log like the parent, share the CPU cores, call the script's function. Here, not in
    the script, so that it pickles by reference whatever launched the parent."""
    proc = process_info()
    configure_worker_logging(Path(run_dir), proc, log_name=f"{Path(script).stem}.log")  # as Hydra names it
    limit_cpu_threads(proc.local_world_size)
    try:
        with stop_on_signals(announce_abort=False):  # the parent says it when a second Ctrl-C aborts
            # A request from before the worker listened: a stop like any other, where the ranks agree.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            if os.environ.get(STOP_ENV):
                request(os.environ[STOP_ENV])
            cfg = OmegaConf.create(config)
            from trainkit.distributed.launch import joined_process_group  # (which imports this module)

            with joined_process_group(cfg) as (proc, device):
                result = _load(script, function)(cfg, Path(run_dir), proc, device)
    except (Stopped, RunFailed) as stop:  # reported in one line already: the parent raises it again
        result = stop
    except ConfigError as error:  # bad input found late (e.g. a data file): one line, from rank 0
        if proc.is_main:
            _hand_back(error)
        sys.exit(1)
    except Exception:
        # Every failing rank prints its error: the launcher shows only the first, often a rank that lost its peer.
        print(f"rank {proc.rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        raise
    # Exit 0 once torch's wrapper has handed `result` to the parent, without the C++ exit-time
    # destructors (see distributed.exit_now_if_a_process_group_was_joined).
    atexit.register(exit_now_if_a_process_group_was_joined, 0)
    return result


def _hand_back(error: ConfigError) -> None:
    """Rank 0's ConfigError to the parent that started the workers (config_errors_from_workers), or printed."""
    error_file = os.environ.get(WORKER_ERROR_ENV)
    if not error_file:
        print(f"error: {error}", file=sys.stderr)
        return
    Path(error_file).write_text(json.dumps({"key": error.key, "message": error.message}))


def _load(script: str, function: str) -> Callable:
    """`function` of the script at `script`, imported under a name of its own (not `__main__`)."""
    spec = importlib.util.spec_from_file_location(f"trainkit_worker_{Path(script).stem}", script)
    assert spec is not None and spec.loader is not None  # a .py path always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(script).parent))
    spec.loader.exec_module(module)
    return getattr(module, function)


def threads_per_worker(local_world_size: int) -> int:
    """CPU threads each local worker may use without oversubscribing the machine's cores."""
    return cores_per_rank(os.cpu_count() or 1, local_world_size)


def limit_cpu_threads(local_world_size: int) -> None:
    if local_world_size > 1:
        torch.set_num_threads(threads_per_worker(local_world_size))


def processes_per_node(cfg: DictConfig) -> int:
    """`distributed.nproc_per_node`; null means one process per visible GPU (so it is checked here)."""
    planned = planned_workers(cfg)
    if planned is not None:
        return planned
    raise ConfigError(
        "distributed.nproc_per_node",
        "is null (one process per GPU) but no GPU is visible; "
        "set distributed.nproc_per_node=N to run N CPU processes with gloo",
    )


def configure_worker_logging(run_dir: Path, proc: ProcessInfo, log_name: str = "train.log") -> None:
    """Rank 0 logs to the console and `log_name` as the Hydra parent does; other ranks warnings and errors only."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if proc.is_main:
        handlers.append(logging.FileHandler(run_dir / log_name))
    logging.basicConfig(
        level=logging.INFO if proc.is_main else logging.WARNING,
        format=LOG_FORMAT,
        datefmt=LOG_DATE_FORMAT,
        handlers=handlers,
        force=True,
    )


@contextlib.contextmanager
def forward_to_workers() -> Iterator[None]:
    """For the parent of self-started DDP workers: pass each stop signal on to them; a second Ctrl-C kills them and
    exits. A worker spawned after the signal finds it in STOP_ENV. Older children (a W&B service) are left alone."""
    others = _child_pids()

    def forward(signum: int, frame: FrameType | None) -> None:
        workers = _child_pids() - others
        try:
            signals.record_stop(signum)
        except signals.Abort:
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            signals.abort(announce=True)
        os.environ[STOP_ENV] = signal.Signals(signum).name  # inherited by workers spawned from now on
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):  # a worker that exited meanwhile
                os.kill(pid, signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        with signals.stop_handlers(forward):
            yield
    finally:
        os.environ.pop(STOP_ENV, None)


def _child_pids() -> set[int]:
    """This process's children: multiprocessing's, and (Linux) the kernel's, which include those still starting."""
    pids = {child.pid for child in multiprocessing.active_children() if child.pid}
    for children in Path("/proc/self/task").glob("*/children"):  # no /proc: multiprocessing's list alone
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            pids.update(int(pid) for pid in children.read_text().split())
    return pids
