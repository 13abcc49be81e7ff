"""The language model's models that only tests need (model._target_=gpt_for_tests.PreemptedGPT): a file of the
language_model row of docs/features.md, so that trimming it leaves models_for_tests.py importable."""

from models_for_tests import PreemptedAt
from trainkit.models.gpt import GPT


class PreemptedGPT(PreemptedAt, GPT):
    """The GPT, preempted at `preempt_at`."""
