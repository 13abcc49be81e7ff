"""The sweep plugins' known, harmless log lines, silenced one exact message at a time.

trainkit.cli calls `quiet_plugin_noise()` before Hydra runs. Each filter matches one message that says nothing a user
can act on (a plugin announcing its arguments), so every other line, every warning and every error still shows. Add an
entry only with a comment saying where it comes from.
"""

import logging
import re


class _DropMessages(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


# logger name -> messages (regex, matched at the start) dropped from it.
KNOWN_LOG_NOISE = {
    # alembic (imported by optuna) announces its plugins at INFO, which Hydra's root logger shows.
    "alembic.runtime.plugins": r"setup plugin ",
    # hydra-joblib-launcher prints every joblib.Parallel argument before each batch.
    "hydra_plugins.hydra_joblib_launcher._core": r"Joblib\.Parallel\(",
}


def quiet_plugin_noise() -> None:
    """Silence the known, harmless plugin log lines (idempotent). Imports nothing heavy: no optuna, no joblib."""
    for logger_name, pattern in KNOWN_LOG_NOISE.items():
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropMessages) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_DropMessages(pattern))
