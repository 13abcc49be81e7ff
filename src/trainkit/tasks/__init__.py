"""Tasks: what a batch means, the loss, the metrics and what a prediction is; yours is a class and a yaml."""

from trainkit.tasks.evaluation import evaluate, evaluation_outputs
from trainkit.tasks.task import Task, mean_over_update_tokens, micro_batches

__all__ = ["Task", "evaluate", "evaluation_outputs", "mean_over_update_tokens", "micro_batches"]
