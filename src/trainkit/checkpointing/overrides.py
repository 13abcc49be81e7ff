"""A checkpoint's config with a command line's overrides on top, for a resume and for eval.py: only what the command
line sets changes; the rest stays as the run had it, values it found itself (a batch size, a class count) included."""

import re
from collections.abc import Callable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from trainkit.config.filled_in import flatten
from trainkit.errors import ConfigError


def hydra_quote(value: str) -> str:
    """`value` as a quoted Hydra override value that Hydra reads back unchanged: a path with commas and '=' (a sweep's
    override_dirname), spaces, brackets or non-ASCII letters would otherwise be a sweep, a list or a syntax error.
    Hydra's rules: quotes get a backslash, backslashes before a quote or at the end are doubled, `${` interpolates."""
    escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + escaped.replace("${", "\\${") + "'"


def config_with_overrides(
    saved_config: dict,
    composed: DictConfig,
    overrides: list[str],
    explicit: bool = True,
    when: str = "on a resume",
    relinked: Callable[[str], bool] = lambda section: True,
) -> DictConfig:
    """A checkpoint's config (plain, resolved) with the keys `overrides` set taken from `composed` (the config Hydra
    composed from the same command line): `a.b=1` sets a.b, `model=<option>` the whole model section, `~a.b` deletes;
    keys added since the checkpoint take their composed defaults. `explicit`: overrides typed by hand, where a global
    group (experiment=) is refused in one line starting with `when`. `relinked(section)`: whether a top-level
    section's links are restored (_relink; eval.py keeps the model's values: its weights are the checkpoint's)."""
    config = OmegaConf.create(saved_config)
    _relink(config, composed, relinked)
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group.replace("/", ".")  # a group (optimizer=adamw): its section
        if key.startswith("hydra") or key == "resume":
            continue
        adds_or_deletes = override.is_delete() or override.is_add() or override.is_force_add()
        if OmegaConf.select(composed, key, default=KeyError) is KeyError and not adds_or_deletes:
            if explicit:  # a global group (experiment=, debug=) sets keys all over the config
                raise ConfigError(
                    key, f"{when}, give the keys to change one by one (e.g. trainer.max_epochs=...), not a group"
                )
            continue
        if override.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(config, parent) if parent else config
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
        else:
            OmegaConf.update(config, key, OmegaConf.select(composed, key), merge=False, force_add=True)
    _add_new_keys(config, composed)
    return config


def _relink(resolved: DictConfig, composed: DictConfig, relinked: Callable[[str], bool]) -> None:
    """Where the config links a key to another (model.dropout: ${regularization.dropout}) and the checkpoint's resolved
    values still agree, restore the link, so an override of the source reaches every key that follows it."""
    saved = flatten(OmegaConf.to_container(resolved))
    for key, value in flatten(OmegaConf.to_container(composed, resolve=False)).items():
        match = re.fullmatch(r"\$\{([\w.]+)\}", value) if isinstance(value, str) else None
        linked = match and key in saved and match.group(1) in saved and saved[key] == saved[match.group(1)]
        if linked and relinked(key.split(".")[0]):
            OmegaConf.update(resolved, key, value, merge=False)


def _add_new_keys(resolved: DictConfig, composed: DictConfig) -> None:
    """Keys added since the checkpoint take their composed values, except inside a factory of another `_target_`."""
    for key, value in flatten(OmegaConf.to_container(composed, resolve=True)).items():
        if OmegaConf.select(resolved, key, default=KeyError) is not KeyError:
            continue
        parts = key.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]
        if all(
            OmegaConf.select(resolved, f"{p}._target_", default=None) == OmegaConf.select(composed, f"{p}._target_")
            for p in parents
        ):
            OmegaConf.update(resolved, key, value, force_add=True)
