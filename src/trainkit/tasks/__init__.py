"""Tasks: what a batch means, the loss, the metrics and what a prediction is; yours is a class and a yaml."""

from trainkit.tasks.evaluation import evaluate, evaluation_outputs
from trainkit.tasks.task import Task, higher_is_better, mean_over_update_tokens, metric_names_of, micro_batches

__all__ = [
    "Task",
    "evaluate",
    "evaluation_outputs",
    "higher_is_better",
    "mean_over_update_tokens",
    "metric_names_of",
    "micro_batches",
]
