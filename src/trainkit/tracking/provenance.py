"""Where a run came from: the code (git commit, branch, uncommitted changes), the command, the
packages and the machine, written by rank 0 into the run directory when the run starts.

- `provenance.json`: the facts below, one JSON object.
- `packages.txt`: every installed distribution, `name==version` a line (a `pip freeze` without pip).
- `code.diff`: `git diff HEAD --binary` (what `git apply` takes back), after a header listing the
  untracked source files git does not ignore; written only when the tree is dirty.

It must stay cheap (a few git calls with a short timeout, no `pip` subprocess) and hold no
secrets: no environment variables, and no credentials from the remote URL.
"""

import getpass
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import torch
from omegaconf import DictConfig, OmegaConf

from trainkit.distributed.process_group import ProcessInfo
from trainkit.runtime import available_cores

log = logging.getLogger("train")  # train.py's logger: its lines

GIT_TIMEOUT_SECONDS = 2.0  # a git call on a slow network file system must not hold up the run
PROVENANCE_FILES = ("provenance.json", "packages.txt", "code.diff")  # what a run start writes
# Untracked files that count as code: listed in code.diff and make the tree dirty. Data, images and
# results left in the checkout do not.
SOURCE_SUFFIXES = (".py", ".pyi", ".pyx", ".ipynb", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh",
                   ".c", ".cc", ".cpp", ".cu", ".h", ".hpp")  # fmt: skip


def record_provenance(
    cfg: DictConfig, run_dir: Path, repository: Path, proc: ProcessInfo, device: torch.device
) -> None:
    """train.py's call, on every rank: rank 0 runs write_provenance before the run is built."""
    if proc.is_main:
        write_provenance(run_dir, repository, cfg.seed, cfg.trainer.deterministic, proc.world_size, device)


def write_provenance(
    run_dir: Path, repository: Path, seed: int, deterministic: bool, world_size: int, device: torch.device
) -> dict[str, Any]:
    """Write provenance.json, packages.txt and code.diff into `run_dir`, and return the facts. Outside a git checkout
    one line says so and the rest is written anyway."""
    keep_earlier_part(run_dir)
    git = git_state(repository)
    if git is None:
        log.info(f"provenance: no commit recorded ({why_no_git(repository)}); the rest is in provenance.json")
    if git is not None and (git["diff"] or git["untracked"]):
        # A header naming the untracked source files, then the diff (`git apply` skips text before the diff).
        header = "".join(f"# untracked, not in the diff below: {path}\n" for path in git["untracked"])
        (run_dir / "code.diff").write_bytes(header.encode() + git["diff"])
    else:  # a resume from a clean tree leaves no diff of an earlier start behind
        (run_dir / "code.diff").unlink(missing_ok=True)
    installed = installed_versions()
    facts = {
        "code": code_version(git),
        "git": None if git is None else {key: value for key, value in git.items() if key != "diff"},
        "command": list(sys.argv),
        "overrides": hydra_overrides(run_dir),
        "start_time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "user": user_name(),
        "python": platform.python_version(),
        "torch": torch_versions(),
        "packages": dependency_versions(installed),
        "cpu": {"model": cpu_model(), "cores": os.cpu_count(), "cores_usable": available_cores()},
        "gpus": gpus() if device.type == "cuda" else [],
        "world_size": world_size,
        "seed": seed,
        "deterministic": deterministic,
        "device": str(device),
    }
    (run_dir / "provenance.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    packages = sorted(installed.items(), key=lambda item: normalized(item[0]))
    freeze = "".join(f"{name}=={version}\n" for name, version in packages)
    (run_dir / "packages.txt").write_text(freeze, encoding="utf-8")
    return facts


def keep_earlier_part(run_dir: Path) -> None:
    """On a resume, move what an earlier part of the run recorded to provenance_parts/<n>/ (1: the first)."""
    if not (run_dir / "provenance.json").is_file():
        return
    parts = run_dir / "provenance_parts"
    part = parts / str(1 + sum(1 for path in parts.glob("*") if path.is_dir()))
    part.mkdir(parents=True)
    for name in PROVENANCE_FILES:
        if (run_dir / name).is_file():
            (run_dir / name).rename(part / name)


def run_git(repository: Path, *args: str) -> bytes | None:
    """git's output, or None when git is missing, fails, or takes longer than GIT_TIMEOUT_SECONDS."""
    try:
        result = subprocess.run(
            ["git", "-C", str(repository), *args], capture_output=True, timeout=GIT_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def git_state(repository: Path) -> dict[str, Any] | None:
    """commit, branch, dirty, remote, untracked source files and the diff against HEAD; None outside a checkout."""
    status = run_git(repository, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "-z")
    if status is None:
        return None
    commit = branch = None
    changed, untracked = False, []
    for entry in status.decode("utf-8", "replace").split("\0"):
        if entry.startswith("# branch.oid "):
            commit = entry.split()[-1] if entry.split()[-1] != "(initial)" else None  # no commit yet
        elif entry.startswith("# branch.head "):
            branch = entry.split(maxsplit=2)[-1]  # "(detached)" on a detached HEAD
        elif entry.startswith("? ") and entry.endswith(SOURCE_SUFFIXES):
            untracked.append(entry[2:])
        elif entry[:2] in ("1 ", "2 ", "u "):
            changed = True
    # A rename's original path, an entry of its own in -z output, is skipped above.
    diff = run_git(repository, "diff", "HEAD", "--binary") if changed and commit else b""
    remote = run_git(repository, "config", "--get", "remote.origin.url")
    return {
        "commit": commit,
        "branch": branch,
        "dirty": changed or bool(untracked),
        "remote": strip_credentials(remote.decode().strip()) if remote else None,
        "untracked": untracked,
        "diff": diff or b"",
    }


def why_no_git(repository: Path) -> str:
    """git's own first line: not a repository, or one it refuses to read (another user's: "dubious ownership")."""
    if shutil.which("git") is None:
        return "git is not installed"
    try:
        result = subprocess.run(
            ["git", "-C", str(repository), "rev-parse", "--git-dir"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"git failed: {error}"
    lines = result.stderr.strip().splitlines()
    return lines[0] if lines else f"git status failed in {repository}"


def code_version(git: dict[str, Any] | None) -> str | None:
    """`a1b2c3d`, or `a1b2c3d+dirty` with uncommitted changes; None outside a checkout."""
    if git is None or git["commit"] is None:
        return None
    return git["commit"][:7] + ("+dirty" if git["dirty"] else "")


def strip_credentials(url: str) -> str:
    """The URL without user name or password (scp-style git@host:x.git is kept)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def hydra_overrides(run_dir: Path) -> list[str]:
    """The command's overrides, from the `.hydra/overrides.yaml` Hydra wrote (also read by DDP workers)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    return [str(item) for item in OmegaConf.load(path)] if path.is_file() else []


def user_name() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no passwd entry and no LOGNAME/USER
        return None


def torch_versions() -> dict[str, Any]:
    """torch, and the CUDA, cuDNN and NCCL it was built with (None where absent)."""
    cuda = torch.cuda.is_available()
    nccl = torch.cuda.nccl.version() if cuda and torch.distributed.is_nccl_available() else None
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
    }


def installed_versions() -> dict[str, str]:
    """{name: version} of every installed distribution, from the head of each METADATA file (importlib is slow)."""
    versions: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
        headers = dict(
            line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if line[:1] != " " and ": " in line
        )
        if "Name" in headers:
            versions.setdefault(headers["Name"], headers.get("Version", "?"))  # the first on sys.path is imported
    return versions


def dependency_versions(installed: dict[str, str]) -> dict[str, str | None]:
    """The installed version (or None) of each of pyproject.toml's `dependencies`; empty without trainkit installed."""
    try:
        requirements = importlib.metadata.requires("trainkit") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    by_name = {normalized(name): version for name, version in installed.items()}
    versions: dict[str, str | None] = {}
    for requirement in requirements:  # e.g. 'torch>=2.4', 'tomli>=2; python_version < "3.11" and extra == "dev"'
        if "extra ==" not in requirement:
            name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
            versions[name] = by_name.get(normalized(name))
    return versions


def normalized(name: str) -> str:
    """A distribution's name as pip compares them: Hydra_Core, hydra.core -> hydra-core."""
    return re.sub(r"[-_.]+", "-", name).lower()


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, Any]]:
    """Each visible GPU's name and memory, and the NVIDIA driver version (Linux: /proc/driver/nvidia)."""
    driver = None
    try:
        version_line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        found = re.search(r"\s(\d+\.\d+(\.\d+)?)\s", version_line)
        driver = found.group(1) if found else None
    except (OSError, IndexError):
        pass
    return [
        {
            "name": torch.cuda.get_device_name(index),
            "memory_gb": round(torch.cuda.get_device_properties(index).total_memory / 2**30, 1),
            "driver": driver,
        }
        for index in range(torch.cuda.device_count())
    ]
