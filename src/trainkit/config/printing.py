"""Print the composed config at the start of a run, as YAML. A capability of docs/features.md prints it as a tree
instead and saves that in the run directory; this is what a clone that dropped it prints."""

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def as_yaml(node: Any, resolve: bool = True) -> str:
    """`node` (left as it is) as YAML, resolved where it can be: one that cannot be yet is shown as written."""
    try:
        return OmegaConf.to_yaml(node, resolve=resolve).rstrip()
    except Exception:
        return OmegaConf.to_yaml(node, resolve=False).rstrip()


def print_config(cfg: Any, run_dir: Path | None = None) -> None:
    """Print `cfg` as YAML on rank 0 (`run_dir` unused: the tree's printer, which saves there, is called the same)."""
    from trainkit.distributed.process_group import process_info  # torch: already imported by train.py

    if process_info().is_main:
        print(as_yaml(cfg), flush=True)
