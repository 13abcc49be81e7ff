"""Tasks: what a batch means, the loss, the metrics, what a prediction is (trainkit.tasks.task has
the contract). `task=classification` (the default), `task=segmentation` and `task=language_model` ship;
yours is a class here and a conf/task/<name>.yaml."""

from trainkit.tasks.evaluation import evaluate, evaluation_outputs
from trainkit.tasks.task import Task, higher_is_better, metric_names_of, task_class
from trainkit.tasks.weighting import mean_over_update_tokens, micro_batches

__all__ = [
    "Task",
    "evaluate",
    "evaluation_outputs",
    "higher_is_better",
    "mean_over_update_tokens",
    "metric_names_of",
    "micro_batches",
    "task_class",
]
