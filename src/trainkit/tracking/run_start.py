"""What rank 0 sets up for a run's reports before it trains: the loggers (metrics.jsonl and the chosen trackers;
a resume continues their runs)."""

from typing import Any

from trainkit.tracking.loggers import build_loggers, run_names
from trainkit.tracking.run_report import recorded_origin


def start_logging(run: Any) -> None:
    """Rank 0: run.loggers (given the config and provenance.json's facts, where recorded), of `Run`
    (trainkit/run.py)."""
    run_name, group = run_names(run_dir=run.run_dir)
    run.loggers = build_loggers(
        run.cfg.logger,
        run.run_dir,
        config=run.resolved_config,
        run_name=run_name,
        group=group,
        resume_ids=run.state.tracker_run_ids,
        provenance=recorded_origin(run.run_dir),
        resume_step=run.state.step if run.cfg.resume else None,
    )
