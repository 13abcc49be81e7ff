"""Run the Hydra entry point and report bad input as one line instead of a stack trace.

Set HYDRA_FULL_ERROR=1 to see the full trace. Unexpected errors (bugs) always keep theirs.
"""
import difflib
import os
import re
import sys
from typing import Callable

from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trainkit.errors import ConfigError


def _flatten(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return re.sub(r"\s+", " ", " ".join(lines))


def _unknown_key(error: OmegaConfBaseException) -> str:
    full_key, key = error.full_key, str(error.key)
    known = [str(k) for k in error.parent_node.keys()] if error.parent_node is not None else []
    close = difflib.get_close_matches(key, known, n=1)
    prefix = full_key[: -len(key)] if full_key.endswith(key) else ""
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    return f"{full_key}: no such key{hint}; to add a new key on purpose write +{full_key}=..."


def one_line(error: BaseException) -> str:
    """A readable single line for a config error raised by us, Hydra or OmegaConf."""
    for cause in _causes(error):
        if isinstance(cause, ConfigError):
            return str(cause)
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and error.options:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return f"{group}={option}: no such option; choose one of {', '.join(sorted(error.options))}"
    for cause in _causes(error):
        # A misspelt override (optimizer.lrr=0.1) surfaces as ConfigAttributeError; cfg["lrr"] as ConfigKeyError.
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and "not in struct" in str(cause):
            return _unknown_key(cause)
    messages = [_flatten(cause) for cause in _causes(error)]
    return " ".join(dict.fromkeys(m for m in messages if m))


def _causes(error: BaseException):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def run(hydra_main: Callable[[], object]) -> None:
    """Call a @hydra.main function; bad input exits 1 with `error: <key>: <what to fix>`."""
    wants_trace = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # makes Hydra re-raise instead of printing its own report
    try:
        hydra_main()
    except (ConfigError, HydraException, OmegaConfBaseException) as error:
        if wants_trace:
            raise
        print(f"error: {one_line(error)}", file=sys.stderr)
        sys.exit(1)
