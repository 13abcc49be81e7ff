"""Checks declared beside their owners: what the class (or function) a `_target_` names says about its
own arguments, read without building it, so that no check in trainkit.config reads a model's, a data
option's or a task's argument names from outside.

An owner may declare
- `config_rules`: {argument: rule}, rules in the words of trainkit.config.schema, applied with RULES;
- `config_problems`: a function whose parameters are named after the owner's arguments (a model's may
  also take `data`, the data section as a dict) yielding (key, message), read like a relation;
- questions a check of another part asks it, named after its arguments too (`input_size_multiple`,
  `own_weights`: trainkit.config.validation asks them with `answer`).
Each is asked with the option's values (a key left out: the owner's default). One that names an argument
the owner does not take (renamed without its check) is refused on one line, never skipped.

An optional feature (docs/features.md) names the module that checks it in its own config section,
`_checks_: <module>` (or {name: module} where several features share a section, as `sweep` does): that
module's `CONFIG_RULES` ({key: rule}) and `CONFIG_RELATIONS` are gathered with the rest, so deleting the
feature's section deletes its checks, and nothing in trainkit.config names a feature.
"""

import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from types import ModuleType

from omegaconf import DictConfig, OmegaConf

from trainkit.config.schema import Check, Relation, to_dict


def parameters(function: object) -> dict[str, inspect.Parameter]:
    """The parameters of a class's constructor or a function, by name."""
    try:
        return dict(inspect.signature(function).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no signature to read: nothing is known of its arguments
        return {}


def answer(owner: object, question: str, section: DictConfig) -> tuple[str | None, object]:
    """(what is wrong, the answer) of a question an owner may declare beside its code (`input_size_multiple`,
    `own_weights`), asked with the option's values of the arguments it names; no answer (None) where the
    owner declares none, an argument has no value or the owner would refuse one (building it says why)."""
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
    """The arguments of `function`, a check or a question `owner` declares beside its code, each named after
    one of the owner's own: the config section's value, else the owner's default (the function's for a name
    only it has); `extra` by name. None when one has no value at all: building the owner says why."""
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
    """(rules, relations) of what `owners` ({"data": the class data._target_ names, "model": ...}, imported,
    not built) declare: their `config_rules` under their group's keys, their `config_problems` as relations
    (skipped while a key it reads has a problem of its own), or one refusal of an owner whose checks name an
    argument it does not take."""
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
    """What is wrong when a check declared beside `owner` names an argument it does not take: one renamed
    without its check, which would otherwise check nothing, quietly."""
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
    """(rules, relations) of the features the config holds: each section's `_checks_` names the module(s)
    declaring them (`CONFIG_RULES`, `CONFIG_RELATIONS`, and `config_rules(cfg)`: rules whose keys depend on the
    config, such as a key named after the data option's unit). A module that cannot be imported (its feature
    deleted, the section kept) is refused on one line naming the key."""
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
    """(key, module) for each module a `_checks_` of the config names; its name where it cannot be imported.
    A module may also declare `ignored_settings(cfg)`: lines for settings of its own that the config leaves
    unused (trainkit.config.validation.ignored_keys prints them), `unread_settings(cfg)`: {key: why nothing reads
    it} (validation.unread_settings: a warning, and a sweep searching the key is refused), `searched_keys(cfg)`
    (searched_keys), and `augmentation_ops(augmentation)`: the ops it switches on in the augmentation section, which
    the core's augmentation checks judge with its own (trainkit.config.validation.augmentation_ops)."""
    found: list[tuple[str, ModuleType | str]] = []
    for key, module_name in _checks_named(cfg, ""):
        try:
            found.append((key, importlib.import_module(module_name)))
        except ImportError:
            found.append((key, module_name))
    return found


def searched_keys(cfg: DictConfig) -> set[str]:
    """The core's keys whose value a feature the config holds searches before training (its module's
    `searched_keys(cfg)`), so that the configured value is only where the search starts: a check comparing
    it with another key (a micro-batch no larger than the batch) cannot hold it to that value."""
    return {
        key for _, feature in feature_modules(cfg) for key in getattr(feature, "searched_keys", lambda cfg: ())(cfg)
    }


def _checks_named(node: DictConfig, prefix: str) -> Iterator[tuple[str, str]]:
    """(key, module) for each `_checks_` in `node` and the sections below it (hydra's own left out)."""
    for name, value in node.items_ex(resolve=False):  # an interpolation to a missing key is not this pass's to say
        key = f"{prefix}{name!s}"
        if name == "_checks_" and isinstance(value, str):
            yield key, value
        elif name == "_checks_" and isinstance(value, DictConfig):
            yield from ((f"{key}.{feature!s}", str(module)) for feature, module in value.items())
        elif isinstance(value, DictConfig) and key != "hydra":
            yield from _checks_named(value, f"{key}.")
