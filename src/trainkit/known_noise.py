"""Known, harmless warnings and plugin log lines, silenced one exact message at a time.

train.py calls `quiet_known_warnings()` once at import. Each filter matches one message that
says nothing a user can act on (a deprecation inside a pinned plugin, a plugin announcing its
arguments), so every other warning and every error still shows. Add an entry only with a
comment saying where the message comes from.
"""
import logging
import re
import warnings

# Message regexes (matched at the start) of warnings that say nothing actionable to a user.
KNOWN_WARNINGS = (
    # SQLAlchemy's MovedIn20Warning, from optuna 2.10 (pinned by hydra-optuna-sweeper) under
    # SQLAlchemy 2.x: optuna's storage models and its alembic migration scripts (which load under
    # their own module names, so the filter matches the message, not the module).
    r"The ``declarative_base\(\)`` function is now available as sqlalchemy\.orm",
)


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


def quiet_known_warnings() -> None:
    """Silence the known, harmless warnings and plugin log lines; call once at import of train.py.

    Each filter matches one exact message, so other warnings and every error still show.
    Imports nothing heavy: no optuna, no SQLAlchemy.
    """
    for message in KNOWN_WARNINGS:
        # The category lives in SQLAlchemy; matching any Warning by its exact message avoids
        # importing SQLAlchemy just to name the class.
        warnings.filterwarnings("ignore", message=message, category=Warning)
    for logger_name, pattern in KNOWN_LOG_NOISE.items():
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropMessages) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_DropMessages(pattern))
