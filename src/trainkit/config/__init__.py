"""The config: the words the schema is written in, the table of rules a key must follow, the one
validation pass that reports every problem in one-line errors, and the config printed as YAML.

train.py imports from here, and `validate` from trainkit.config.validation: the rules read names from
the modules they check (schedules, loggers, precisions), which themselves import from here, so
importing it here would go round in a circle. The modules inside import each other directly."""

from trainkit.config.filled_in import record_filled_in
from trainkit.config.printing import print_config
from trainkit.config.schema import resolved, to_dict

__all__ = ["print_config", "record_filled_in", "resolved", "to_dict"]
