"""Run a Hydra entry point the way every trainkit script needs it run: `cli.run(main)`. Before Hydra composes: register
the resolvers and write into the command line what Hydra must know before it makes the run directory. After: report
bad input as one line (HYDRA_FULL_ERROR=1 shows the trace; bugs keep theirs)."""

import contextlib
import difflib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trainkit.checkpointing.refusal import start_call, undo_refused_call  # feature: undo_refusals
from trainkit.checkpointing.resume import rewrite_argv
from trainkit.distributed.process_group import exit_now_if_a_process_group_was_joined
from trainkit.distributed.torchrun_hydra import agree_on_launch_time, hydra_overrides_for_this_rank, launch_time
from trainkit.errors import ConfigError, RunFailed, caused_by_config_error, causes
from trainkit.tuning.plugin_noise import quiet_plugin_noise  # feature: sweeps
from trainkit.tuning.sweep_stop import leaving_worker_after_a_stop, stop_the_whole_sweep  # feature: sweeps


def _group_options(group: str) -> list[str]:
    """The options of config group `group` in the script's conf/, as Hydra finds them; [] where there is none."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    conf = Path(sys.argv[0]).resolve().parent / "conf"
    if not group or not conf.is_dir():
        return []
    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf))).get_group_options(group)


def one_line(error: BaseException) -> str:
    """A readable single line for a config error raised by us, Hydra or OmegaConf."""
    for cause in causes(error):
        if isinstance(cause, ConfigError):
            return str(cause)
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        options = error.options or _group_options(group)  # Hydra lists none for an option inside a list
        if options:
            return f"{group}={option}: no such option; choose one of {', '.join(sorted(options))}"
    for cause in causes(error):
        # A misspelt override (optimizer.lrr=0.1) surfaces as ConfigAttributeError; cfg["lrr"] as ConfigKeyError.
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and "not in struct" in str(cause):
            full_key, key, parent = str(cause.full_key), str(cause.key), cause.parent_node
            known = [str(k) for k in parent.keys()] if parent is not None else []  # noqa: SIM118 (a node, not a dict)
            close = difflib.get_close_matches(key, known, n=1)
            prefix = full_key[: -len(key)] if full_key.endswith(key) else ""
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            return f"{full_key}: no such key{hint}; to add a new key on purpose write +{full_key}=..."
    messages = [re.sub(r"\s+", " ", str(cause)).strip() for cause in causes(error)]
    return " ".join(dict.fromkeys(m for m in messages if m))


_user_wants_trace = os.environ.get("HYDRA_FULL_ERROR") == "1"


def report_config_errors(task: Callable) -> Callable:
    """Wrap a Hydra task so bad input exits in one line; in a sweep that ends the sweep (bad values fail every job)."""
    task = leaving_worker_after_a_stop(task)  # feature: sweeps

    @functools.wraps(task)
    def wrapper(cfg: DictConfig) -> Any:  # a closure, not a context decorator: joblib's workers unpickle it
        with _one_line_errors(caused_by_config_error):  # a ConfigError, or one hydra.utils.instantiate wrapped
            return task(cfg)

    return wrapper


def _list_app_groups_only() -> None:
    """For --help: list the app's config groups only (our help templates show no others), saving the half second
    Hydra spends walking its own. It replaces a method of Hydra's internal class; if that changes, Hydra's stays."""
    from hydra._internal.hydra import Hydra

    if not callable(getattr(Hydra, "format_config_groups", None)):
        return

    def format_config_groups(self: Any, predicate: Callable[[str], bool], compact: bool = True) -> str:
        loader, options = self.config_loader, {}

        def walk(parent: str) -> None:
            for name in loader.list_groups(parent):
                group = f"{parent}/{name}" if parent else name
                if predicate(group) and not predicate("hydra"):  # predicate("hydra"): Hydra's own list
                    options[group] = loader.get_group_options(group)
                    walk(group)

        walk("")
        return "".join(f"{group}: {', '.join(sorted(options[group]))}\n" for group in sorted(options) if options[group])

    Hydra.format_config_groups = format_config_groups  # type: ignore[method-assign]


def run(hydra_main: Callable[[], object], resumes: bool = True) -> None:
    """Call a @hydra.main function; bad input exits 1 with `error: <key>: <what to fix>`. `resumes=False`: a script
    that continues no run (eval.py) refuses resume=."""
    global _user_wants_trace
    _user_wants_trace = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        OmegaConf.register_new_resolver("launch_time", launch_time, use_cache=True, replace=True)
        if "--help" in sys.argv or "-h" in sys.argv:
            _list_app_groups_only()
        agree_on_launch_time()
        os.environ["HYDRA_FULL_ERROR"] = "1"  # makes Hydra re-raise instead of printing its own report
        with _one_line_errors(lambda error: isinstance(error, (ConfigError, HydraException, OmegaConfBaseException))):
            start_call()  # feature: undo_refusals
            sys.argv = hydra_command_line(sys.argv, resumes)
            quiet_plugin_noise()  # feature: sweeps
            hydra_main = stop_the_whole_sweep(sys.argv)(hydra_main)  # feature: sweeps
            hydra_main()
    except KeyboardInterrupt:  # eval.py's Ctrl-C (train.py's stop handlers turn it into a clean stop)
        if _user_wants_trace:
            raise
        print("interrupted (Ctrl-C): stopped before the end; what was written so far stays", file=sys.stderr)
        exit_now_if_a_process_group_was_joined(130)
        sys.exit(130)
    except SystemExit as stop:
        exit_now_if_a_process_group_was_joined(stop.code)
        raise
    finally:
        if startup := sys.modules.get("trainkit.startup"):  # train.py's handlers while it started, if still on
            startup.done()
    exit_now_if_a_process_group_was_joined(0)


def hydra_command_line(argv: list[str], resumes: bool) -> list[str]:
    """The command line @hydra.main composes from, which must say what Hydra needs before it makes the run directory:
    under torchrun, that ranks other than 0 write nothing of Hydra's; with resume=, rewrite_argv's run directory."""
    return rewrite_argv([*argv, *hydra_overrides_for_this_rank()], resumes)


@contextlib.contextmanager
def _one_line_errors(bad_input: Callable[[Exception], bool]) -> Iterator[None]:
    """Exit 1, before Hydra adds its own 'Error executing job' line, on `bad_input` (printed in one line) or RunFailed
    (a non-finite loss: the run logged why and wrote summary.json)."""
    try:
        yield
    except RunFailed:
        if _user_wants_trace:
            raise
        sys.exit(1)
    except Exception as error:
        if not bad_input(error):
            raise
        undo_refused_call()  # feature: undo_refusals
        if _user_wants_trace:
            raise
        print(f"error: {one_line(error)}", file=sys.stderr)
        sys.exit(1)
