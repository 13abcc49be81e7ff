"""What a run set and what it filled in, recorded apart.

    <run>/.hydra/config.yaml      # the config as composed: what the command line, conf/ and an experiment set
    <run>/.hydra/filled_in.yaml   # {dotted key: value} for each key the run filled in itself (the data's class
                                  # count, the task's metric, a searched batch size, and the keys that follow them)

A resume rewrites config.yaml from the checkpoint's config with the filled-in keys put back as they were set, so a
continued run records the same settings as one that never stopped, and a tool that groups or diffs runs never reads
a filled-in value as a difference of settings."""

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from trainkit.config.schema import to_dict

FILLED_IN = "filled_in.yaml"  # in the run's .hydra/, beside config.yaml
_ABSENT = object()


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for every leaf of nested dicts (an empty dict is a leaf)."""
    if isinstance(tree, dict) and tree:
        return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def resolved_leaves(config: DictConfig | ListConfig) -> dict[str, Any]:
    """{"a.b": value} for every leaf of `config`, resolved where it can be (Hydra's resolvers cannot outside a run)."""
    try:
        return flatten(OmegaConf.to_container(config, resolve=True))
    except Exception:  # one key at a time: only the unresolvable stay as written
        leaves = {}
        for key, value in flatten(OmegaConf.to_container(config, resolve=False)).items():
            try:
                leaf = OmegaConf.select(config, key)
                leaves[key] = OmegaConf.to_container(leaf, resolve=True) if OmegaConf.is_config(leaf) else leaf
            except Exception:
                leaves[key] = value
        return leaves


def record_filled_in(cfg: DictConfig, run_dir: Path, is_main: bool = True) -> None:
    """Rank 0 writes `.hydra/filled_in.yaml`: each key whose value in `cfg` is not the one .hydra/config.yaml sets.
    Nothing where Hydra wrote no config.yaml (a run started by train(cfg))."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not is_main or not saved.is_file():
        return
    set_there = resolved_leaves(OmegaConf.load(saved))
    filled = {key: value for key, value in resolved_leaves(cfg).items() if set_there.get(key, _ABSENT) != value}
    OmegaConf.save(OmegaConf.create(filled), saved.with_name(FILLED_IN))


def as_set(resolved: DictConfig, composed: DictConfig, run_dir: Path) -> DictConfig:
    """A resume's config as it was set: `resolved` (the checkpoint's, with this command's overrides) with the keys its
    run filled in taken from `composed` (Hydra's, from this command line); before filled_in.yaml: null or auto keys."""
    record = run_dir / ".hydra" / FILLED_IN
    leaves = resolved_leaves(composed)
    if record.is_file():
        keys = list(flatten(OmegaConf.to_container(OmegaConf.load(record)) or {}))
    else:
        keys = [key for key, value in leaves.items() if value is None or value == "auto"]
    config = OmegaConf.create(to_dict(resolved))
    for key in keys:
        if key in leaves and OmegaConf.select(config, key, default=_ABSENT) is not _ABSENT:
            OmegaConf.update(config, key, leaves[key], merge=False)
    return config
