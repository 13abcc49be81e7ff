"""Rerun a run from its run directory alone: the recorded commit, its uncommitted changes, its overrides.

    python scripts/rerun.py outputs/runs/<time>                           # -> outputs/reruns/<time>-<now>
    python scripts/rerun.py outputs/runs/<time> trainer.max_epochs=3     # overrides after RUN are appended
    python scripts/rerun.py outputs/runs/<time> hydra.run.dir=elsewhere
    python scripts/rerun.py outputs/runs/<time> --dry-run                # print the commands only

Checks out the commit of RUN's provenance.json in a temporary git worktree of this checkout, applies
RUN's code.diff there (the untracked files it lists are not in it: one line names them), and runs that
tree's train.py with RUN's .hydra/overrides.yaml (less `resume=`) into a new run directory, importing
that tree's trainkit. One line warns when the installed versions of the project's dependencies differ
from the recorded ones. The worktree is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def recorded(run_dir: Path) -> tuple[dict, list[str]]:
    """provenance.json's facts and the run's overrides, less `resume=` (the rerun starts afresh)."""
    provenance_file, overrides_file = run_dir / "provenance.json", run_dir / ".hydra" / "overrides.yaml"
    if not provenance_file.is_file():
        fail(f"{provenance_file} not found: give a run directory that train.py wrote (it writes provenance.json)")
    facts = json.loads(provenance_file.read_text(encoding="utf-8"))
    if not (facts.get("git") or {}).get("commit"):
        fail(f"{provenance_file} records no commit (the run was not started in a git checkout): nothing to check out")
    overrides = [str(item) for item in OmegaConf.load(overrides_file)] if overrides_file.is_file() else []
    return facts, [item for item in overrides if not item.lstrip("+~").startswith("resume=")]


def version_differences(facts: dict) -> list[str]:
    """`name installed (run: recorded)` for each dependency (and torch) whose version changed."""
    sys.path.insert(0, str(ROOT / "src"))
    from trainkit.tracking.provenance import dependency_versions, installed_versions

    recorded_versions = {**(facts.get("packages") or {}), "torch": (facts.get("torch") or {}).get("version")}
    now = {**dependency_versions(installed_versions()), "torch": None}
    import torch

    now["torch"] = torch.__version__
    return [
        f"{name} {now.get(name)} (run: {version})"
        for name, version in sorted(recorded_versions.items())
        if version is not None and now.get(name) != version
    ]


def commands(run_dir: Path, facts: dict, overrides: list[str], extra: list[str], tree: Path) -> list[list[str]]:
    """git worktree add, git apply (when the run had a code.diff), python train.py; cwd: this checkout."""
    steps = [["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), facts["git"]["commit"]]]
    diff = run_dir / "code.diff"
    if diff.is_file() and b"\ndiff --git " in b"\n" + diff.read_bytes():  # not the untracked files' header alone
        steps.append(["git", "-C", str(tree), "apply", "--binary", str((run_dir / "code.diff").resolve())])
    run_dir_given = any(item.startswith("hydra.run.dir=") for item in extra)
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    new_dir = [] if run_dir_given else [f"hydra.run.dir={Path('outputs/reruns').resolve() / run_dir.name}-{stamp}"]
    steps.append([sys.executable, str(tree / "train.py"), *overrides, *new_dir, *extra])
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory to rerun")
    parser.add_argument("overrides", nargs="*", help="overrides appended to the recorded ones")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    facts, overrides = recorded(
        args.run_dir,
    )
    tree = Path(tempfile.mkdtemp(prefix="trainkit-rerun-")) / "tree"
    steps = commands(args.run_dir, facts, overrides, args.overrides, tree)
    untracked = facts["git"].get("untracked") or []
    if untracked:
        print(f"rerun: the run had untracked files that code.diff does not hold: {', '.join(untracked)}")
    differences = version_differences(facts)
    if differences:
        print(f"rerun: installed versions differ from the run's: {', '.join(differences)}")
    # The checkout's own package, not the installed one (an editable install points at this checkout's src/).
    python_path = os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")]))
    if args.dry_run:  # the commands as they run: train.py with the PYTHONPATH set for it
        for step in steps[:-1]:
            print(shlex.join(step))
        print(f"PYTHONPATH={shlex.quote(python_path)} {shlex.join(steps[-1])}")
        print(shlex.join(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]))
        tree.parent.rmdir()
        return 0
    env = {**os.environ, "PYTHONPATH": python_path}
    try:
        for step in steps[:-1]:
            subprocess.run(step, check=True)
        return subprocess.run(steps[-1], env=env).returncode  # the rerun's own exit code
    except subprocess.CalledProcessError as error:
        fail(f"{shlex.join(error.cmd)} failed (exit {error.returncode})")
        return 1
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
