"""What a run reports (tracking/run_report.py), the loggers it reports to (tracking/loggers/) and its epoch's sums
(tracking/epoch_totals.py). The other modules here are features, each imported from its own marked lines."""

from trainkit.tracking.epoch_totals import EpochTotals
from trainkit.tracking.loggers import Loggers, recorded_origin, start_logging
from trainkit.tracking.run_report import epoch_line, log_epoch_notes, training_line, write_summary

__all__ = [
    "EpochTotals",
    "Loggers",
    "epoch_line",
    "log_epoch_notes",
    "recorded_origin",
    "start_logging",
    "training_line",
    "write_summary",
]
