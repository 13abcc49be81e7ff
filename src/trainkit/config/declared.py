"""Checks declared beside their owners, read without building them, so that no check in trainkit.config names them.
The class (or function) a `_target_` names may declare `config_rules` ({argument: rule}), `config_problems` (a
function of its arguments, and of `data` for a model, yielding (key, message)) and questions other checks ask it
with `answer` (`input_size_multiple`), each asked with the option's values, else the owner's defaults; one naming an
argument the owner does not take is refused on one line. A feature's config section names its checking module
(`_checks_`), whose `CONFIG_RULES` and `CONFIG_RELATIONS` are gathered with the rest (docs/features.md)."""

import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from types import ModuleType

from omegaconf import DictConfig, OmegaConf

from trainkit.config.filled_in import flatten
from trainkit.config.schema import Check, Relation, to_dict


def parameters(function: object) -> dict[str, inspect.Parameter]:
    """The parameters of a class's constructor or a function, by name."""
    try:
        return dict(inspect.signature(function).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no signature to read: nothing is known of its arguments
        return {}


def answer(owner: object, question: str, section: DictConfig) -> tuple[str | None, object]:
    """(what is wrong, the answer) of the owner's `question`, asked with the option's values; None where it can't be."""
    asked = getattr(owner, question, None)
    if not callable(asked):
        return None, None
    stale, given = not_taken(owner, parameters(asked)), arguments(owner, asked, section)
    if stale or given is None:
        return stale, None
    try:
        return None, asked(**given)
    except Exception:  # arguments the constructor would refuse too: building the model says why
        return None, None


def arguments(owner: object, function: object, section: DictConfig, **extra: object) -> dict[str, object] | None:
    """`function`'s arguments: `extra`, else the section's value, else `owner`'s default; None if one has no value."""
    takes, given = parameters(owner), {}
    for name, parameter in parameters(function).items():
        default = takes[name].default if name in takes else parameter.default
        if name in extra:
            given[name] = extra[name]
        elif name in section:
            value = section[name]
            given[name] = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
        elif default is not inspect.Parameter.empty:
            given[name] = default
        else:
            return None
    return given


def declared(owners: Mapping[str, object]) -> tuple[dict[str, Check], list[Relation]]:
    """(rules, relations) that `owners` ({"data": class, ...}) declare: `config_rules` under their group's keys,
    `config_problems` as relations, or, where a check names an argument the owner does not take, one that refuses it."""
    rules: dict[str, Check] = {}
    relations = []
    for group, owner in owners.items():
        own_rules, check = getattr(owner, "config_rules", {}), getattr(owner, "config_problems", None)
        extra = ("data",) if group == "model" else ()
        stale = not_taken(owner, [*own_rules, *(parameters(check) if callable(check) else ())], extra)
        if stale:
            relations.append(Relation((f"{group}._target_",), partial(_refuse, f"{group}._target_", stale)))
            continue
        rules |= {f"{group}.{name}": rule for name, rule in own_rules.items()}
        if callable(check):
            reads = [name if name in extra else f"{group}.{name}" for name in parameters(check)]
            relations.append(Relation((f"{group}._target_", *reads), partial(_ask, owner, check, group, extra)))
    return rules, relations


def not_taken(owner: object, names: Iterable[str], extra: tuple[str, ...] = ()) -> str | None:
    """What is wrong when a check declared beside `owner` names an argument it does not take."""
    takes = parameters(owner)
    open_ended = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in takes.values())
    unknown = [name for name in names if name not in takes and name not in extra]
    if not takes or open_ended or not unknown:
        return None
    owner_name = getattr(owner, "__name__", owner)
    return (
        f"{owner_name}'s config checks read {', '.join(unknown)}, which {owner_name} does not take; name them "
        f"after its arguments ({', '.join(takes)})"
    )


def _refuse(key: str, message: str, cfg: DictConfig) -> Iterator[tuple[str, str]]:
    yield key, message


def _ask(
    owner: object, check: Callable, group: str, extra: tuple[str, ...], cfg: DictConfig
) -> Iterator[tuple[str, str]]:
    given = arguments(owner, check, cfg[group], **{name: to_dict(cfg[name]) for name in extra})
    if given is not None:
        yield from check(**given)


def feature_checks(cfg: DictConfig) -> tuple[dict[str, Check], list[Relation]]:
    """(rules, relations) of the modules the config's `_checks_` name; one that cannot be imported is refused."""
    rules: dict[str, Check] = {}
    relations: list[Relation] = []
    for key, module in feature_modules(cfg):
        if isinstance(module, str):
            message = f"names {module!r}, which cannot be imported; remove the section of a feature you deleted"
            relations.append(Relation((key,), partial(_refuse, key, message)))
            continue
        rules |= getattr(module, "CONFIG_RULES", {}) | getattr(module, "config_rules", lambda cfg: {})(cfg)
        relations += getattr(module, "CONFIG_RELATIONS", ())
    return rules, relations


def feature_modules(cfg: DictConfig) -> list[tuple[str, ModuleType | str]]:
    """(key, module) for each module a `_checks_` of the config names (`_checks_: <module>`, or `{<name>: <module>}`;
    hydra's own section left out), its name where it cannot be imported. Such a module may also declare what
    trainkit.config.validation asks of it (`ignored_settings(cfg)`, `searched_keys`...)."""
    found: list[tuple[str, ModuleType | str]] = []
    for key, value in flatten(OmegaConf.to_container(cfg, resolve=False)).items():  # not resolved: not ours to say
        *_, parent, name = ["", *key.split(".")]
        if ((name == "_checks_" and isinstance(value, str)) or parent == "_checks_") and not key.startswith("hydra."):
            try:
                found.append((key, importlib.import_module(str(value))))
            except ImportError:
                found.append((key, str(value)))
    return found
