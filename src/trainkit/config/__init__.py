"""The config: the schema's words, the rules a key must follow, the one validation pass that reports every problem in
one-line errors, and the config printed as YAML. `validate` is imported from trainkit.config.validation: its rules
import the modules they check (schedules, loggers), which import from here, so importing it here would be circular."""

from trainkit.config.filled_in import record_filled_in
from trainkit.config.printing import print_config
from trainkit.config.schema import resolved, to_dict

__all__ = ["print_config", "record_filled_in", "resolved", "to_dict"]
