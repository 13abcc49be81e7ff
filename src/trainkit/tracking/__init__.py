"""What a run reports: where it came from (provenance.json, where trainkit.tracking.provenance wrote it), the loggers
(metrics.jsonl and the trackers: tracking/loggers/), the start, epoch and closing lines, summary.json.

train.py imports from here; the modules inside import each other directly. The profiler (debug=profile,
trainkit.tracking.profiling) and eval.py's pictures of a model's predictions (eval_figures) are optional features, and
so are the pictures of samples and predictions the trackers are shown (logger.log_images and log_predictions,
trainkit.tracking.prediction_images): each is imported by its own module or marked line (docs/features.md)."""

from trainkit.tracking.epoch_totals import EpochTotals
from trainkit.tracking.loggers import Loggers, build_loggers, run_names
from trainkit.tracking.run_report import epoch_line, log_epoch_notes, recorded_origin, training_line, write_summary
from trainkit.tracking.run_start import start_logging

__all__ = [
    "EpochTotals",
    "Loggers",
    "build_loggers",
    "epoch_line",
    "log_epoch_notes",
    "recorded_origin",
    "run_names",
    "start_logging",
    "training_line",
    "write_summary",
]
