"""The one error type for bad user input: it names the config key and says how to fix it."""

from collections.abc import Iterator


class ConfigError(ValueError):
    """A bad config value or a missing input file: `key` is the dotted config key at fault (e.g. "optimizer.lr"),
    the message says what is wrong and how to fix it. train.py prints `error: <key>: <message>` and exits 1."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class RunFailed(RuntimeError):
    """Training stopped on a failure it has already reported in one line (a non-finite loss): the process exits 1
    without a traceback; in a sweep the trial counts as failed and the sweep goes on."""


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then what it was raised from, and so on down the chain."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def caused_by_config_error(error: BaseException) -> bool:
    """True when `error` is a ConfigError or wraps one (hydra.utils.instantiate wraps what the factories raise)."""
    return any(isinstance(cause, ConfigError) for cause in causes(error))
