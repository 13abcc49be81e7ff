"""The words the config schema is written in, and the one pass that applies it. A check takes one value and returns
what is wrong with it (a message that ends in the fix), or None; a relation reads several keys and yields (key, message)
for each contradiction. Checks stay pure, so one pass collects every problem of a config, not just the first."""

from __future__ import annotations

import math
import operator
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

Check = Callable[[object], "str | None"]
Bound = float | None  # a limit of a range, or None: no limit
_ABSENT = object()


@dataclass(frozen=True)
class Relation:
    """Keys checked against each other, skipped while any key in `reads` has a problem of its own."""

    reads: tuple[str, ...]
    check: Callable[[DictConfig], Iterable[tuple[str, str]]]


def show(value: object) -> str:
    """A value as a message shows it: a string quoted, with its type, since 'abc' and 1 differ."""
    if isinstance(value, str):
        return f"{value!r} (str)"
    if OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value))
    return str(value)


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """`cfg` resolved into plain Python containers: the plain dict the rest of the package passes around."""
    return cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=True))


def resolved(cfg: DictConfig, found: Mapping[str, Any]) -> DictConfig:
    """A read-only copy of `cfg` with what the run found set (`found`, by dotted key), then every interpolation resolved
    (a key that follows a found one takes its value): a later write raises, never changes the run behind its back."""
    config = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for key, value in found.items():
        OmegaConf.update(config, key, value, merge=False)
    # struct as Hydra composes it (reading a key it lacks is an error), and read-only
    return OmegaConf.create(to_dict(cast("DictConfig", config)), flags={"struct": True, "readonly": True})


def _is_number(value: object, whole: bool = False) -> TypeGuard[float]:
    if isinstance(value, bool):  # YAML's true is an int to Python, never a number here
        return False
    if whole:
        return isinstance(value, int)
    return isinstance(value, (int, float)) and not math.isnan(value)


def _bounds(minimum: Bound, maximum: Bound, above: Bound, below: Bound) -> str:
    """' in [0, 1)', ' > 0', ' <= 5', or '' without bounds."""
    low = f"[{minimum}" if minimum is not None else f"({above}" if above is not None else None
    high = f"{maximum}]" if maximum is not None else f"{below})" if below is not None else None
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" >= {minimum}" if minimum is not None else f" > {above}"
    if high:
        return f" <= {maximum}" if maximum is not None else f" < {below}"
    return ""


def number(
    minimum: Bound = None,
    maximum: Bound = None,
    *,
    above: Bound = None,
    below: Bound = None,
    whole: bool = False,
    null: bool = False,
) -> Check:
    """A number (not NaN, not a bool) within the bounds: minimum/maximum inclusive, above/below not."""
    bounds = _bounds(minimum, maximum, above, below)
    kind = f"{'a whole number' if whole else 'a number'}{bounds}{' or null' if null else ''}"
    limits = ((minimum, operator.ge), (maximum, operator.le), (above, operator.gt), (below, operator.lt))

    def check(value: object) -> str | None:
        if value is None and null:
            return None
        if _is_number(value, whole) and all(limit is None or holds(value, limit) for limit, holds in limits):
            return None
        return f"must be {kind}, got {show(value)}"

    return check


def integer(minimum: int | None = None, maximum: int | None = None, *, null: bool = False) -> Check:
    return number(minimum, maximum, whole=True, null=null)


def numbers(
    minimum: Bound = None, *, above: Bound = None, below: Bound = None, whole: bool = False, length: int | None = None
) -> Check:
    """A list of numbers, each within the bounds; `length` fixes how many."""
    each = f"{'whole numbers' if whole else 'numbers'}{_bounds(minimum, None, above, below)}"
    kind = f"a list of {length} {each}" if length else f"a list of {each}"
    element = number(minimum, above=above, below=below, whole=whole)

    def check(value: object) -> str | None:
        items = value if isinstance(value, Sequence) and not isinstance(value, str) else ()
        if items and length in (None, len(items)) and not any(map(element, items)):
            return None
        return f"must be {kind}, e.g. [{', '.join(['0.5'] * (length or 1))}]; got {show(value)}"

    return check


def interval(minimum: Bound = None, *, above: Bound = None, null: bool = False) -> Check:
    """[low, high] with both within the bound and low <= high."""
    pair = numbers(minimum, above=above, length=2)

    def check(value: object) -> str | None:
        if value is None and null:
            return None
        problem = pair(value)
        # pair() accepted it, so it is a list of two numbers.
        if problem is None and isinstance(value, Sequence) and value[0] > value[1]:
            problem = f"needs low <= high, got {show(value)}"
        return problem

    return check


def auto_or(check: Check) -> Check:
    """The word `auto` (the code picks the value for this machine), or what `check` accepts."""

    def auto_or_check(value: object) -> str | None:
        problem = None if value == "auto" else check(value)
        return problem and problem.replace("must be ", "must be auto or ", 1)

    return auto_or_check


def flag(*, null: bool = False) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or (value is None and null):
            return None
        return f"must be true or false{' (or null: off)' if null else ''}, got {show(value)}"

    return check


def one_of(*choices: str, null: bool = False) -> Check:
    def check(value: object) -> str | None:
        if (isinstance(value, str) and value in choices) or (null and value is None):
            return None
        return f"must be one of {', '.join(choices)}{' or null' if null else ''}; got {show(value)}"

    return check


def string(*, null: bool = False) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, str) or (value is None and null):
            return None
        return f"must be a string{' or null' if null else ''}, got {show(value)}"

    return check


def section(known: Sequence[str]) -> Check:
    """A group of options (a mapping), or null for off; its keys are checked by `unknown_keys`."""

    def check(value: object) -> str | None:
        if value is None or isinstance(value, Mapping):
            return None
        return f"must be a mapping with keys {', '.join(known)}, or null for off; got {show(value)}"

    return check


def unknown_keys(prefix: str, known: Sequence[str]) -> Relation:
    """A closed section: every key in it is one the code reads (a typo would be ignored silently)."""

    def check(cfg: DictConfig) -> Iterator[tuple[str, str]]:
        node = OmegaConf.select(cfg, prefix, default=None)
        for key in node.keys() if isinstance(node, Mapping) else ():
            if key not in known:
                yield f"{prefix}.{key}", f"unknown key; the known keys are {', '.join(known)}"

    return Relation((prefix,), check)


def _has_problem(key: str, problems: Mapping[str, str]) -> bool:
    """`key`, a section above it or a key inside it is already wrong: checking it again would say the same twice."""
    return any(p == key or p.startswith(key + ".") or key.startswith(p + ".") for p in problems)


def find_problems(cfg: DictConfig, rules: Mapping[str, Check], relations: Sequence[Relation]) -> dict[str, str]:
    """{key: message} for every problem: required `???` keys still missing, then each key that fails its rule (keys
    absent from the config are skipped: rules cover every group's options), then contradictions between keys."""
    unresolved = dict(_unresolved_interpolations(cfg, ""))
    if unresolved:  # every other check would read a key that cannot be resolved
        return unresolved
    problems = {key: f"is required; pass {key}=..." for key in sorted(OmegaConf.missing_keys(cfg))}
    for key, check in rules.items():
        value = _ABSENT if _has_problem(key, problems) else OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and (message := check(value)):
            problems[key] = message
    for relation in relations:
        if any(_has_problem(key, problems) for key in relation.reads):
            continue
        for key, message in relation.check(cfg):
            problems.setdefault(key, message)
    return problems


def _unresolved_interpolations(node: DictConfig | ListConfig, prefix: str) -> Iterator[tuple[str, str]]:
    """(key, message) for each `${...}` naming a key the config lacks: an option made for other data."""
    keys: Iterable[Any] = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        full_key = f"{prefix}.{key}" if prefix else str(key)
        child: Any = node._get_node(key)
        if child is not None and child._is_interpolation():
            try:
                node[key]
            except InterpolationKeyError:
                yield full_key, _unresolved_message(full_key, str(child._value()), node._get_root())
        elif isinstance(child, DictConfig | ListConfig):
            yield from _unresolved_interpolations(child, full_key)


def _unresolved_message(key: str, reads: str, root: Any) -> str:
    """`key` reads `reads`, which the chosen option of its group lacks: name the options of `key`'s own group made
    for that option (Data.suits), then those of the other group that have the key, then a value to set."""
    from hydra.core.hydra_config import HydraConfig

    target = reads.removeprefix("${").removesuffix("}")
    group, _, name = target.partition(".")
    chosen = root.get(group)  # root: the whole config, a DictConfig
    option = chosen.get("name") if isinstance(chosen, DictConfig) else None
    lacking = f"{group}={option} has no {target}" if option else f"the config has no {target}"
    own_group = key.partition(".")[0]
    mine = HydraConfig.get().runtime.choices.get(own_group) if HydraConfig.initialized() else None  # Hydra's choice
    setter = f"{own_group}={mine}" if mine and isinstance(mine, str) else f"the option setting {key}"
    suiting = _suited_options(chosen, own_group) if group == "data" and isinstance(chosen, DictConfig) else []
    made_for = f"{' or '.join(f'{own_group}={o}' for o in suiting)} (made for {group}={option}), or " if suiting else ""
    having = _options_with_key(group, name)
    pick = f"{' or '.join(f'{group}={o}' for o in having)} for {setter}" if having else "options made together"
    return (
        f"is {reads}, but {lacking}: {setter} is made for other {group}; "
        f"pick {made_for}{pick} (an experiment= pairs them), or set {key}=<value>"
    )


def _suited_options(data: DictConfig, group: str) -> list[str]:
    """The options of `group` that the chosen data option's class says suit it (`Data.suits`), for a hint."""
    from trainkit.data.datasets import data_class
    from trainkit.errors import ConfigError

    try:
        suits = data_class(str(data.get("_target_"))).suits
    except ConfigError:
        return []
    named = [choice.partition("=")[2] for choice in suits if choice.partition("=")[0] == group]
    folder = Path(sys.argv[0]).resolve().parent / "conf" / group  # a trimmed clone may lack some of them
    return [option for option in named if not folder.is_dir() or (folder / f"{option}.yaml").is_file()]


def _options_with_key(group: str, key: str) -> list[str]:
    """The options of `group` in the script's conf/ whose yaml sets `key` at its top level (for a hint)."""
    folder = Path(sys.argv[0]).resolve().parent / "conf" / group
    if not key.isidentifier() or not folder.is_dir():
        return []
    line = re.compile(rf"^{key}\s*:", re.MULTILINE)
    return sorted(path.stem for path in folder.glob("*.yaml") if line.search(path.read_text(errors="replace")))
