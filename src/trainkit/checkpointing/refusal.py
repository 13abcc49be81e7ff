"""A call refused before it did any work leaves the disk as it found it.

    python train.py resume=<run> data.split_seed=5   # refused (the data changed): every file of <run> as it was
    python train.py -m seed=1,2,7 hydra.sweep.dir=S  # job 2 refused (another trial): S/2 as it was
    python train.py trainer.max_epochs=-1            # refused: the new outputs/runs/<time>/ is removed again
    python eval.py checkpoint=no/such/run            # refused: no outputs/eval/<time>/ left behind

Why undo rather than check first: Hydra writes the run directory before the task function runs, and a resume's last
checks come late (once the data is built), after it rewrote the run's record.

So `RunDirectoryGuard`, a Hydra callback (conf/config.yaml), notes what a run directory holds before Hydra touches it
and as the job starts (in the job's process, with any launcher). When the call is refused, trainkit.cli calls
`undo_refused_call`:

- a directory this call created is removed, with the parent folders it created (and a sweep directory it created, once
  that holds nothing but Hydra's multirun.yaml);
- an existing one gets back the bytes of the files at its top and in .hydra/ (a file over KEPT_BYTES, such as a long
  train.log, is cut back to its old length: Hydra only appends to it), and loses every file and folder this call added
  anywhere in it.

A refusal is a one-line error raised before the run saved a checkpoint or logged a metric line; an error after that
leaves the directory as it is. Under torchrun rank 0 alone does this.
"""

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from trainkit.checkpointing.run_lock import LOCK_FILE

KEPT_BYTES = 64 * 2**20  # a record file up to this size is kept whole; a larger one by its length
HYDRA_RECORD = ".hydra"


@dataclasses.dataclass
class Snapshot:
    """What a directory held: every file's length and time, and the bytes of its record files."""

    root: Path
    existed: bool
    created_from: Path  # the deepest existing folder above `root`: what this call made lies below it
    taken_at: float = dataclasses.field(default_factory=time.time)
    files: dict[str, os.stat_result] = dataclasses.field(default_factory=dict)  # relative path -> stat
    contents: dict[str, bytes] = dataclasses.field(default_factory=dict)  # record files: relative path -> bytes
    folders: set[str] = dataclasses.field(default_factory=set)


def _is_record(relative: str) -> bool:
    return str(Path(relative).parent) in (".", HYDRA_RECORD)


def take_snapshot(root: Path, before_hydra: bool = False) -> Snapshot:
    """`root` as it is now. `before_hydra`: only what Hydra may change before the job starts (for a sweep's jobs)."""
    root = _absolute(root)
    created_from = root
    while not created_from.exists() and created_from != created_from.parent:
        created_from = created_from.parent
    snapshot = Snapshot(root, root.is_dir(), created_from if created_from != root else root.parent)
    if not snapshot.existed:
        return snapshot
    for folder, subfolders, names in os.walk(root):
        relative_folder = Path(folder).relative_to(root)
        if before_hydra and str(relative_folder) not in (".", HYDRA_RECORD):
            subfolders.clear()
            continue
        snapshot.folders.update(str(relative_folder / name) for name in subfolders)
        for name in names:
            relative = str(relative_folder / name)
            keep = relative.startswith(f"{HYDRA_RECORD}/") if before_hydra else _is_record(relative)
            try:
                stat = (root / relative).stat()
                if keep and stat.st_size <= KEPT_BYTES:
                    snapshot.contents[relative] = (root / relative).read_bytes()
            except OSError:  # gone meanwhile, or unreadable: not ours to put back
                continue
            snapshot.files[relative] = stat
    return snapshot


def _with_hydra_record_from(job: Snapshot, before_hydra: Snapshot) -> Snapshot:
    """The job's snapshot with the record files as they were before Hydra wrote them (so they count as added)."""
    job.existed, job.created_from = before_hydra.existed, before_hydra.created_from
    for relative in [r for r in job.files if _is_record(r)]:
        if relative not in before_hydra.files:
            del job.files[relative]
            job.contents.pop(relative, None)
        elif relative in before_hydra.contents:
            job.files[relative], job.contents[relative] = before_hydra.files[relative], before_hydra.contents[relative]
    if HYDRA_RECORD not in before_hydra.folders:
        job.folders.discard(HYDRA_RECORD)
    return job


_this_job: Snapshot | None = None  # the directory of the job running in this process, as it was


class RunDirectoryGuard(Callback):
    """Notes what the run (or each sweep job's) directory holds before Hydra writes there; see the module."""

    def __init__(self) -> None:
        self.before_hydra: dict[Path, Snapshot] = {}
        self.sweep: Snapshot | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _is_main_rank():
            run_dir = _absolute(config.hydra.run.dir)
            self.before_hydra[run_dir] = take_snapshot(run_dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _is_main_rank():
            return
        sweep_dir = _absolute(config.hydra.sweep.dir)
        self.sweep = take_snapshot(sweep_dir, before_hydra=True)
        # Any folder may become a job's directory: each is noted, down to an earlier launch's job directories.
        for folder, subfolders, _ in os.walk(sweep_dir):
            if Path(folder) != sweep_dir:
                self.before_hydra[Path(folder)] = take_snapshot(Path(folder), before_hydra=True)
            if HYDRA_RECORD in subfolders:
                subfolders.clear()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _this_job
        _this_job = None
        if not _is_main_rank():
            return
        job_dir = _absolute(config.hydra.runtime.output_dir)
        before = self.before_hydra.get(job_dir)
        if before is None and self.sweep is not None:  # a job directory this sweep makes now
            before = Snapshot(
                job_dir, existed=False, created_from=self.sweep.created_from, taken_at=self.sweep.taken_at
            )
            if self.sweep.existed:
                before.created_from = self.sweep.root
        now = take_snapshot(job_dir)
        _this_job = _with_hydra_record_from(now, before) if before is not None else now

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        global _this_job
        from hydra.core.utils import JobStatus

        if job_return.status == JobStatus.COMPLETED:  # a failed job's error may still be a refusal (trainkit.cli)
            _this_job = None


def _absolute(path: object) -> Path:
    """As Hydra names a job's directory (hydra.runtime.output_dir): absolute, with no `..` left."""
    return Path(os.path.abspath(str(path)))


def _made_since(root: Path, since: float) -> bool:
    """Whether everything in `root` is newer than `since` (a second of slack): a last check before removing it."""
    try:
        return all(path.lstat().st_mtime >= since - 1 for path in [root, *root.rglob("*")])
    except OSError:  # changing under us: not removed
        return False


def _is_main_rank() -> bool:
    from trainkit.distributed.process_group import process_info

    return process_info().is_main


def did_work(snapshot: Snapshot) -> bool:
    """Whether the call saved a checkpoint or logged a metric line since `snapshot`."""
    root, then = snapshot.root, snapshot.files
    for path in (root / "checkpoints").rglob("*"):
        relative = str(path.relative_to(root))
        if path.is_file() and (relative not in then or _changed(path.stat(), then[relative])):
            return True
    metrics = root / "metrics.jsonl"
    if not metrics.is_file():
        return False
    if "metrics.jsonl" in snapshot.contents:  # trimmed to the checkpoint is no work; a new line is
        return not snapshot.contents["metrics.jsonl"].startswith(metrics.read_bytes())
    # A metrics file opened but empty is no work (a refusal during the first batch leaves no run behind).
    return metrics.stat().st_size > (then["metrics.jsonl"].st_size if "metrics.jsonl" in then else 0)


def _changed(now: os.stat_result, then: os.stat_result) -> bool:
    return (now.st_size, now.st_mtime_ns) != (then.st_size, then.st_mtime_ns)


def start_call() -> None:
    """Forget the job of an earlier call in this process (tests run many calls in one)."""
    global _this_job
    _this_job = None


def undo_refused_call() -> None:
    """Put the job's directory back as it was, if the call did no work. Does nothing outside a job, a second time,
    or where another run holds the directory's .lock."""
    global _this_job
    snapshot, _this_job = _this_job, None
    if snapshot is None or not snapshot.root.is_dir():
        return
    with _unless_in_use(snapshot.root) as free:
        if not free or did_work(snapshot):
            return
        _close_log_files_in(snapshot.root)  # nothing more is appended to a log this puts back
        if snapshot.existed:
            _put_back(snapshot)
            return
        if not _made_since(snapshot.root, snapshot.taken_at):
            return
    shutil.rmtree(snapshot.root, ignore_errors=True)
    _remove_empty_folders_between(snapshot.root.parent, snapshot.created_from)


@contextlib.contextmanager
def _unless_in_use(root: Path) -> Iterator[bool]:
    """Hold the run directory's lock within; False when another process holds it."""
    if not (root / LOCK_FILE).is_file():
        yield True
        return
    with open(root / LOCK_FILE, "rb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _put_back(snapshot: Snapshot) -> None:
    root = snapshot.root
    for folder, subfolders, names in os.walk(root, topdown=False):
        relative_folder = Path(folder).relative_to(root)
        for name in names:
            relative = str(relative_folder / name)
            if relative not in snapshot.files:
                (root / relative).unlink(missing_ok=True)
            elif relative in snapshot.contents:
                _restore_file(root / relative, snapshot.contents[relative], snapshot.files[relative])
            elif _is_record(relative) and (root / relative).stat().st_size > snapshot.files[relative].st_size:
                then = snapshot.files[relative]
                with open(root / relative, "r+b") as grown:  # appended to (a long log): cut back
                    grown.truncate(then.st_size)
                os.utime(root / relative, ns=(then.st_atime_ns, then.st_mtime_ns))
        for name in subfolders:
            relative = str(relative_folder / name)
            if relative not in snapshot.folders:
                shutil.rmtree(root / relative, ignore_errors=True)
    for relative, content in snapshot.contents.items():  # moved away or removed by the call
        if not (root / relative).exists():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            _restore_file(root / relative, content, snapshot.files[relative])


def _restore_file(path: Path, content: bytes, stat: os.stat_result) -> None:
    if not path.is_file() or path.read_bytes() != content:
        with open(path, "wb") as file:  # in place: a held flock (.lock) stays on the same file
            file.write(content)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _remove_empty_folders_between(folder: Path, created_from: Path) -> None:
    """Remove `folder` and its parents while they are empty (or hold only multirun.yaml), up to `created_from`."""
    while folder != created_from and created_from in folder.parents:
        leftover = [path.name for path in folder.iterdir()] if folder.is_dir() else []
        if leftover == ["multirun.yaml"]:
            (folder / "multirun.yaml").unlink()
        elif leftover:
            return
        if folder.is_dir():
            folder.rmdir()
        folder = folder.parent


def _close_log_files_in(root: Path) -> None:
    """Hydra's log file (train.log): a line logged after the undo would land in a file put back or removed."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in [each for each in loggers if isinstance(each, logging.Logger)]:  # not PlaceHolders
        for handler in list(logger.handlers):
            filename = getattr(handler, "baseFilename", None)
            if filename and Path(filename).is_relative_to(root):
                handler.close()
                logger.removeHandler(handler)
