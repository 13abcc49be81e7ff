"""The config check of the language model (data=text, model=gpt, task=language_model, eval.py's prompt= and
sample.*): what each declares beside its code (TextBlocks, GPT, LanguageModel, trainkit.tasks.prompting), gathered
as an option of yours would be. A file of the language_model row of docs/features.md."""

import pytest

from conftest import composed
from trainkit.config.validation import problems, validate
from trainkit.errors import ConfigError

GPT = ["experiment=stdlib_gpt"]
EVAL_KEYS = ["+_checks_.prompt=trainkit.tasks.prompting"]  # eval.py's keys, added to train.py's config here


CASES = [
    ([*GPT, "data.block_size=0"], "data.block_size"),
    ([*GPT, "data.pattern=3"], "data.pattern"),
    ([*EVAL_KEYS, "+prompt=42"], "prompt"),
    ([*EVAL_KEYS, "+sample.max_new_tokens=0"], "sample.max_new_tokens"),
    ([*EVAL_KEYS, "+sample.temperature=-1"], "sample.temperature"),
    ([*EVAL_KEYS, "+sample.top_k=0"], "sample.top_k"),
    ([*EVAL_KEYS, "+sample.seed=-1"], "sample.seed"),
    ([*GPT, "augmentation=shift"], "augmentation"),  # image augmentation on text
    ([*GPT, "trainer.tta_flip=true"], "trainer.tta_flip"),
    ([*GPT, "model.block_size=64"], "model.block_size"),
    ([*GPT, "model.n_head=3"], "model.n_embd"),
    ([*GPT, "model.n_layer=0"], "model.n_layer"),
    ([*GPT, "model.n_head=0"], "model.n_head"),
    ([*GPT, "model.n_embd=-1"], "model.n_embd"),
    # the task's config_rules: a silently greedy or unfiltered sample
    ([*GPT, "task.sample_temperature=-1"], "task.sample_temperature"),
    ([*GPT, "task.sample_top_k=0"], "task.sample_top_k"),
    ([*GPT, "task.sample_tokens=abc"], "task.sample_tokens"),
    ([*GPT, "task.sample_seed=null"], "task.sample_seed"),
    ([*GPT, "task.prompt_bytes=0"], "task.prompt_bytes"),
]


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(overrides) for overrides, _ in CASES])
def test_each_mistake_is_one_config_error_naming_its_key(overrides, key):
    cfg = composed(*overrides)
    assert list(problems(cfg)) == [key]
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


def test_a_quoted_number_is_a_prompt():
    assert problems(composed(*EVAL_KEYS, "+prompt='42'")) == {}


def test_model_gpt_on_data_without_blocks_names_the_key_it_reads():
    key, message = next(iter(problems(composed("model=gpt")).items()))
    message = f"{key}: {message}"
    assert message.startswith("model.block_size: ")
    assert "${data.block_size}, but data=digits has no data.block_size" in message
