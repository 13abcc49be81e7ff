"""The config: the words of its schema, the rules a key must follow, the one validation pass that reports every
problem in one-line errors, and the config printed as YAML. `validate` is imported from trainkit.config.validation:
its rules read the modules they check (schedules, loggers), which import from here, so here it would be a circle."""

from trainkit.config.filled_in import record_filled_in
from trainkit.config.printing import print_config
from trainkit.config.schema import resolved, to_dict

__all__ = ["print_config", "record_filled_in", "resolved", "to_dict"]
