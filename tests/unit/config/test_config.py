"""The schema: every config-only mistake is found in one pass before anything is built, named by
its key on one line; ignored settings are warned about; cli.one_line makes any config error one line."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import InstantiationException, MissingConfigException

from conftest import composed, made_for, run_here
from helpers import has_file_data, needs_image_folders, template_has, unless_trimmed
from trainkit.cli import one_line
from trainkit.config.declared import feature_checks
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, ignored_keys, problems, validate
from trainkit.errors import ConfigError
from trainkit.tracking.loggers import trackers

if has_file_data:
    from file_data_for_tests import SIZED_SIGNALS

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"
# What an option needs beyond what it is made for (conftest.made_for: the data a model or task option suits, what
# a data option's class says suits it, a stand-in for each `???` key): a key a real run passes on the command line,
# and the flips of an augmentation, which need data whose mirror image keeps its label (the digits refuse them).
# The per-image recipes run on an image folder alone; once image_folders is trimmed they still compose (their keys
# exist for the rules) but no data validates them.
IMAGE_FOLDER = ["data=imagefolder", "data.root=/data/images"] if template_has("data/imagefolder.yaml") else []
PER_IMAGE = ("augmentation=randaugment", "augmentation=trivialaugment")
REQUIRED_BY_OPTION = {
    "model=hf": ["model.config={model_type: bert}"],  # a folder or a config: none by default
    "augmentation=basic": ["data.mirror_changes_label=false"],
    "augmentation=strong": ["data.mirror_changes_label=false"],
    "augmentation=randaugment": IMAGE_FOLDER,
    "augmentation=trivialaugment": IMAGE_FOLDER,
    "experiment=finetune_imagefolder": ["data.root=/data/images", "finetune.pretrained_path=/weights/resnet18.pt"],
}


def made_with(override: str) -> list[str]:
    """`override` and what it is composed with: what it is made for, then what it needs beyond that."""
    return [override, *made_for(override), *REQUIRED_BY_OPTION.get(override, [])]


@pytest.fixture
def compose_config():
    """compose(overrides) against the real conf/: a fresh copy of conftest's composition, which
    each set of overrides gets once a session (the rule cases are composed by several tests)."""
    return lambda overrides=(): composed(*overrides)


def test_default_config_validates(compose_config):
    cfg = compose_config()
    validate(cfg)
    assert cfg.data.name == "digits"  # the no-download default


def test_resolved_sets_what_a_run_found_before_resolving_and_is_read_only(compose_config):
    from omegaconf.errors import ReadonlyConfigError

    from trainkit.config.schema import resolved

    cfg = compose_config(["data.num_classes=null"])
    run_cfg = resolved(cfg, {"data.num_classes": 7, "data.batch_size": 5})
    assert (run_cfg.data.num_classes, run_cfg.model.num_classes, run_cfg.data.batch_size) == (7, 7, 5)
    assert cfg.data.num_classes is None and cfg.data.batch_size == 64  # the composed config is left as it was
    with pytest.raises(ReadonlyConfigError):
        run_cfg.trainer.micro_batch_size = 4
    with pytest.raises(AttributeError):
        run_cfg.trainer.no_such_key  # noqa: B018  # struct, as Hydra composes it: a typo is an error


def group_options() -> list[str]:
    return [
        f"{group.name}={option.stem}"
        for group in sorted(CONF.iterdir())
        if group.is_dir() and group.name != "hydra"
        for option in sorted(group.glob("*.yaml"))
    ]


@pytest.mark.parametrize(
    "override", [pytest.param(o, marks=needs_image_folders) if o in PER_IMAGE else o for o in group_options()]
)
def test_every_group_option_composes_and_validates(compose_config, override):
    validate(compose_config(made_with(override)))


IMAGES = ["data=imagefolder", "data.root=/data/images"]
TEXTS = ["data=textfolder", "data.root=/data/texts", "model=sequence"]
FUNCTIONS = ["experiment=stdlib_functions"]
NEEDS_TEXT = pytest.mark.skipif(not template_has("data/textfolder.yaml"), reason="no text classification (trimmed)")
PIXELS = ["task._target_=tasks_for_tests.PixelClasses"]  # one target per pixel, as a segmentation has

TABLE = [  # the digits as a table (tests/data_for_tests.py): data that is not images, without their keys
    "data._target_=data_for_tests.DigitsTable",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",  # model=cnn reads data.channels, which a table has not
]

# ---- one case per rule: (overrides, the key the error names) --------------------------------

RULE_CASES = [
    (["seed=-1"], "seed"),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),  # a size or null; auto: micro_batch_auto widens it
    (["seed=1.5"], "seed"),
    (["device=gpu"], "device"),
    (["device=cuda:x"], "device"),
    (["device=''"], "device"),
    (["resume=3"], "resume"),
    (["print_config=yes"], "print_config"),
    (["optimized_metric=3"], "optimized_metric"),
    (["task._target_=3"], "task._target_"),
    (["required=[3]"], "required"),
    (["trainer.max_epochs=abc"], "trainer.max_epochs"),
    (["trainer.max_epochs=0"], "trainer.max_epochs"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches"),
    (["trainer.grad_clip=0"], "trainer.grad_clip"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps"),
    (["trainer.checkpoint_every_n_steps=0"], "trainer.checkpoint_every_n_steps"),
    (["trainer.limit_train_batches=0"], "trainer.limit_train_batches"),
    (["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches"),
    (["trainer.channels_last=1"], "trainer.channels_last"),
    (["trainer.cudnn_benchmark=fast"], "trainer.cudnn_benchmark"),
    (["trainer.deterministic=yes"], "trainer.deterministic"),
    (["trainer.compile=yes"], "trainer.compile"),
    (["trainer.progress_bar=2"], "trainer.progress_bar"),
    (["data.name=3"], "data.name"),
    (["data._target_=3"], "data._target_"),
    (["data.root=3"], "data.root"),
    (["data.download=yes"], "data.download"),
    (["data.channels=0"], "data.channels"),
    (["data.image_size=0"], "data.image_size"),
    (["data.mirror_changes_label=yes"], "data.mirror_changes_label"),
    (["data.num_classes=0"], "data.num_classes"),  # 1 is a regression's one output
    (["data.mean=0.5"], "data.mean"),
    (["data.mean=[a]"], "data.mean"),
    (["data.std=[0]"], "data.std"),
    (["data.val_fraction=0"], "data.val_fraction"),
    (["data.test_fraction=1.5"], "data.test_fraction"),
    (["data.split_seed=-1"], "data.split_seed"),
    (["data.batch_size=0"], "data.batch_size"),
    (["data.batch_size=1.5"], "data.batch_size"),
    (["data.eval_batch_size=0"], "data.eval_batch_size"),
    (["data.num_workers=-1"], "data.num_workers"),
    ([*TEXTS, "data.num_workers=many"], "data.num_workers"),
    (["data.drop_last=maybe"], "data.drop_last"),
    (["data.shuffle=maybe"], "data.shuffle"),
    (["optimizer.lr=0"], "optimizer.lr"),
    (["optimizer.lr=-1"], "optimizer.lr"),
    (["optimizer.lr=abc"], "optimizer.lr"),
    (["optimizer.weight_decay=-1"], "optimizer.weight_decay"),
    (["optimizer.momentum=1.5"], "optimizer.momentum"),
    (["optimizer.nesterov=maybe"], "optimizer.nesterov"),
    (["optimizer=adamw", "optimizer.betas=[0.9]"], "optimizer.betas"),
    (["optimizer=adamw", "optimizer.betas=[0.9,1.0]"], "optimizer.betas"),
    (["optimizer=adamw", "optimizer.eps=0"], "optimizer.eps"),
    (["optimizer.head_lr_scale=-1"], "optimizer.head_lr_scale"),
    (["optimizer.scale_lr_with_batch=yes"], "optimizer.scale_lr_with_batch"),
    (["optimizer.reference_batch_size=0"], "optimizer.reference_batch_size"),
    (["precision.name=fp8"], "precision.name"),
    (["precision.tf32=1"], "precision.tf32"),
    (["optimizer.fused=always"], "optimizer.fused"),
    (["regularization.label_smoothing=1.5"], "regularization.label_smoothing"),
    (["regularization.dropout=1"], "regularization.dropout"),
    (["regularization.early_stopping.enabled=maybe"], "regularization.early_stopping.enabled"),
    (["regularization.early_stopping.monitor=3"], "regularization.early_stopping.monitor"),
    (["regularization.early_stopping.mode=up"], "regularization.early_stopping.mode"),
    (["regularization.early_stopping.patience=0"], "regularization.early_stopping.patience"),
    (["regularization.early_stopping.min_delta=-1"], "regularization.early_stopping.min_delta"),
    (["augmentation.name=3"], "augmentation.name"),
    (["augmentation=shift", "augmentation.crop_padding='a bit'"], "augmentation.crop_padding"),
    (["augmentation=shift", "augmentation.crop_padding=2.0"], "augmentation.crop_padding"),
    (["augmentation=basic", "augmentation.horizontal_flip=yes"], "augmentation.horizontal_flip"),
    (["distributed.name=3"], "distributed.name"),
    (["distributed.parallel=3"], "distributed.parallel"),
    (["distributed.nproc_per_node=0"], "distributed.nproc_per_node"),
    (["distributed=ddp", "distributed.nproc_per_node=true"], "distributed.nproc_per_node"),
    (["distributed.backend=mpi"], "distributed.backend"),
    (["distributed.sync_batchnorm=yes"], "distributed.sync_batchnorm"),
    (["distributed.timeout_seconds=0"], "distributed.timeout_seconds"),
    (["+logger.trackers.nosuch=true"], "logger.trackers"),
    (["+logger.trackers.none=yes"], "logger.trackers"),
]

# Keys that contradict each other, or settings the chosen options need.
RELATION_CASES = [
    # a schedule is the function scheduler._target_ names; the section's other keys are its arguments
    (["+scheduler.name=linear"], "scheduler.name"),
    (["scheduler._target_=trainkit.schedules.nowhere"], "scheduler._target_"),
    (["data.batch_size=32", "trainer.micro_batch_size=48"], "trainer.micro_batch_size"),  # nothing to split
    (["task._target_=tasks_for_tests.InBatchContrastive", "trainer.micro_batch_size=16"], "trainer.micro_batch_size"),
    ([*TABLE, "trainer.channels_last=true"], "trainer.channels_last"),
    (["required=[trainer.max_steps]"], "trainer.max_steps"),
    ([*PIXELS, "+task.class_names=[zero,one]"], "task.class_names"),  # digits have 10 classes
    (["required=[trainer.max_stepz]"], "required"),
    (["data._target_=data_for_tests.FolderOfMine", "data.root=null"], "data.root"),
    (["data=cached", "data.root=null"], "data.root"),
    (["data._target_=nowhere.load_images"], "data._target_"),
    (["~data._target_"], "data._target_"),
    (["data._target_=trainkit.data.datasets.carve"], "data._target_"),  # a function, not an ImageData
    # the data option's keys are its dataclass's fields
    (["+data.eval_samples=128"], "data.eval_samples"),
    (["~data.val_fraction"], "data.val_fraction"),
    (["data=imagefolder", "data.root=null"], "data.root"),
    (
        ["data=imagefolder", "data.root=/data/images", "data.channels=2", "data.mean=[0.5]", "data.std=[0.25]"],
        "data.channels",
    ),
    (["data.val_fraction=0.5", "data.test_fraction=0.5"], "data.val_fraction"),
    (["optimizer.momentum=0"], "optimizer.nesterov"),
    (["regularization.early_stopping.mode=max"], "regularization.early_stopping.mode"),
    (["device=cpu", "distributed.sync_batchnorm=true"], "distributed.sync_batchnorm"),
    (["device=cpu", "distributed.backend=nccl"], "distributed.backend"),
    # a strategy of its own names its class (distributed.parallel); without one the name is none or ddp
    (["distributed.name=zero"], "distributed.name"),
    (["distributed.parallel=trainkit.distributed.nowhere.Sharded"], "distributed.parallel"),
    (["+augmentation.flip=true"], "augmentation.flip"),  # its keys, and those its `_checks_` modules check
    (["+augmentation.crop_padding=0.1"], "augmentation.name"),
    (["augmentation=basic"], "augmentation.horizontal_flip"),  # a mirrored digit is another digit
    (["augmentation=shift", "+augmentation.horizontal_flip=true"], "augmentation.horizontal_flip"),
    # the task names what may be monitored and optimized
    (["optimized_metric=foo"], "optimized_metric"),
    (["optimized_metric=val/miou"], "optimized_metric"),  # classification has no miou
    (["regularization.early_stopping.monitor=train/loss"], "regularization.early_stopping.monitor"),
    (["task._target_=trainkit.tasks.nowhere.Missing"], "task._target_"),
    # a target per pixel: what moves the image must move its targets
    ([*PIXELS, "augmentation=shift"], "augmentation.crop_padding"),
    # image operations on data that is not images
    ([*TABLE, "augmentation=shift"], "augmentation"),
    # a model with one class per pixel needs a task with one target per pixel
    (["model._target_=models_for_tests.PixelCNN"], "model._target_"),
    # a model's class says what the side must be divisible by (8, for 3 halvings)
    ([*PIXELS, "model._target_=models_for_tests.PixelCNN", "model.widths=[8,16,32,64]"], "data.image_size"),
]

# Checks a model or data option declares on its own arguments (`config_problems`, beside its code)
DECLARED_CASES = [
    ([*FUNCTIONS, "model.max_length=256"], "model.max_length"),  # SequenceClassifier
    ([*FUNCTIONS, "data.max_tokens=256"], "data.max_tokens"),  # TextData
    # text's data options' config_rules
    ([*TEXTS, "data.max_length=0", "model.max_length=1024"], "data.max_length"),
    ([*TEXTS, "data.class_folders=[pos]"], "data.class_folders"),
    ([*TEXTS, "data.class_folders=[neg,neg]"], "data.class_folders"),  # neg's files twice, as two labels
    ([*FUNCTIONS, "data.packages=1"], "data.packages"),
    # the file loader's keys (FileData's config_rules), and what reads files
    ([*TEXTS, "data.prefetch_factor=0"], "data.prefetch_factor"),
    ([*TEXTS, "data.pin_memory=sometimes"], "data.pin_memory"),
    ([*TEXTS, "data.skip_bad_files=maybe"], "data.skip_bad_files"),
    *(
        [
            ([*SIZED_SIGNALS, "+data.prefetch_factor=0"], "data.prefetch_factor"),  # file data of yours
            ([*SIZED_SIGNALS, "+data.pin_memory=sometimes"], "data.pin_memory"),
            ([*SIZED_SIGNALS, "+data.skip_bad_files=maybe"], "data.skip_bad_files"),
        ]
        if has_file_data
        else []
    ),
    (["data.mean=[0.1,0.2]"], "data.mean"),  # ImageData
    (["data.channels=3", "data.mean=[0.1,0.2,0.3]", "data.std=[0.2,0.2]"], "data.std"),
    (["model._target_=models_for_tests.HalvingCNN", "model.widths=[7,8]"], "model.widths"),  # one of yours
    # each model's config_rules: what its arguments may hold
    ([*FUNCTIONS, "model.vocabulary=1"], "model.vocabulary"),
    ([*FUNCTIONS, "model.max_length=0"], "model.max_length"),
    ([*FUNCTIONS, "model.width=0"], "model.width"),
    ([*FUNCTIONS, "model.depth=0"], "model.depth"),
    ([*FUNCTIONS, "model.heads=0"], "model.heads"),
    ([*FUNCTIONS, "model.feedforward=0"], "model.feedforward"),
    ([*FUNCTIONS, "model.pad_id=-1"], "model.pad_id"),
    (["model.widths=[0,8]"], "model.widths"),
    # each schedule's config_rules (trainkit.schedules)
    (["scheduler.warmup_epochs=-1"], "scheduler.warmup_epochs"),
    (["scheduler.warmup_start_factor=1.5"], "scheduler.warmup_start_factor"),
    (["scheduler.min_lr_ratio=2"], "scheduler.min_lr_ratio"),
]
RULE_CASES, RELATION_CASES = (
    unless_trimmed(unless_trimmed(cases, "data=imagefolder"), "data=cached") for cases in (RULE_CASES, RELATION_CASES)
)
RULE_CASES, RELATION_CASES, DECLARED_CASES = (  # text's options, once a trim deleted them
    unless_trimmed(unless_trimmed(cases, "data=textfolder"), "experiment=stdlib_functions")
    for cases in (RULE_CASES, RELATION_CASES, DECLARED_CASES)
)
CASES = RULE_CASES + RELATION_CASES + DECLARED_CASES


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_every_mistake_is_one_config_error_naming_its_key(compose_config, overrides, key):
    cfg = compose_config(overrides)
    assert list(problems(cfg)) == [key]  # exactly this one: nothing reported twice or as a knock-on
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert error.value.key == key
    assert str(error.value).startswith(f"{key}: ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides, key", RULE_CASES, ids=[" ".join(o) for o, _ in RULE_CASES])
def test_each_rule_case_is_found_by_its_rule(compose_config, overrides, key):
    assert key in find_problems(compose_config(overrides), {key: RULES[key]}, [])


def test_every_rule_has_a_case():
    assert set(RULES) <= {key for _, key in RULE_CASES}


def test_every_relation_has_a_case_that_only_it_finds(compose_config):
    configs = [(compose_config(overrides), key) for overrides, key in RELATION_CASES]
    for cfg, _ in configs:
        fill_task_defaults(cfg)  # as validate does first: the task's metrics where conf/ leaves them null
    for cfg, key in configs:
        assert key not in find_problems(cfg, RULES, [])  # no single-key rule finds these
    for relation in RELATIONS:
        assert any(key in find_problems(cfg, {}, [relation]) for cfg, key in configs), relation


@pytest.mark.parametrize("overrides, key", DECLARED_CASES, ids=[" ".join(o) for o, _ in DECLARED_CASES])
def test_a_check_declared_beside_its_owner_is_gathered_and_none_in_config_reads_its_names(
    compose_config, overrides, key
):
    cfg = compose_config(overrides)
    fill_task_defaults(cfg)
    assert key not in find_problems(cfg, RULES, RELATIONS)  # no check in trainkit.config finds it
    assert key in problems(cfg)  # the owner's own, gathered


def test_every_rule_key_exists_in_some_option():
    """A rule on a key no config has would never run: a misspelt rule."""
    from omegaconf import OmegaConf

    keys = set()
    for override in group_options():  # composed as test_every_group_option_composes_and_validates does
        cfg = composed(*made_with(override))
        keys |= {key for key in RULES if OmegaConf.select(cfg, key, default=KeyError) is not KeyError}
    eval_config = OmegaConf.load(CONF / "eval.yaml")  # eval.py's own keys
    keys |= {key for key in RULES if OmegaConf.select(eval_config, key, default=KeyError) is not KeyError}
    assert keys == set(RULES)


def test_every_logger_rule_has_its_key_without_a_tracker():
    """conf/config.yaml holds the logger keys a run reads (off), so with no tracker at all (each deletable:
    docs/features.md) every logger rule, the core's or a feature's beside its code, still has its key."""
    cfg = composed("logger=none")
    rules = RULES | feature_checks(cfg)[0]
    assert {key for key in rules if key.startswith("logger.")} == {f"logger.{key}" for key in cfg.logger} - {
        "logger._checks_"
    }


def test_the_input_size_a_model_takes_comes_from_its_class_and_its_options_settings(compose_config):
    """PixelCNN.input_size_multiple(widths): 2 ** levels, asked with model.widths before any directory exists."""
    deeper = [*PIXELS, "model._target_=models_for_tests.PixelCNN", "model.widths=[8,16,32,64]", "data.image_size=36"]
    assert problems(compose_config(deeper)) == {
        "data.image_size": "is 36, but models_for_tests.PixelCNN (model.widths=[8, 16, 32, 64]) takes sizes "
        "divisible by 16; use data.image_size=32 or 48, or a model that halves the size fewer times"
    }
    shallow = [*PIXELS, "model._target_=models_for_tests.PixelCNN", "model.widths=[8]", "data.image_size=30"]
    assert problems(compose_config(shallow)) == {}
    assert problems(compose_config(["data.image_size=30"])) == {}  # model=cnn declares no multiple: any size


def test_a_dataset_of_your_own_is_checked_by_its_class_like_the_built_in_ones(compose_config):
    """No list of dataset names: what the data needs (a data.root, whether data.download means
    anything) comes from the class data._target_ names (tests/data_for_tests.py)."""
    mine = "data._target_=data_for_tests.FolderOfMine"
    assert problems(compose_config([mine])) == {
        "data.root": "is required for digits; pass data.root=... (the folder of mine)"
    }
    cfg = compose_config([mine, "data.root=/data/mine", "data.download=true"])
    assert problems(cfg) == {} and ignored_keys(cfg) == []  # data=digits would warn of both


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["+scheduler.name=linear"], ["is not an argument of trainkit.schedules.cosine", "warmup_epochs"]),
        (["+logger.trackers.nosuch=true"], ["unknown tracker nosuch", f"the trackers are {', '.join(trackers())}"]),
        (["device=gpu"], ["'gpu'", "cuda:N"]),
        (["trainer.max_epochs=abc"], ["a whole number >= 1", "'abc' (str)"]),
        (["data.std=[0]"], ["numbers > 0", "[0]"]),
        (
            ["+augmentation.flip=true"],
            ["unknown key", "the known keys are name, crop_padding, horizontal_flip, _checks_"],
        ),
        (
            ["augmentation=basic"],
            ["data.mirror_changes_label=true", "augmentation=shift", "data.mirror_changes_label=false"],
        ),
        (["data._target_=data_for_tests.FolderOfMine"], ["is required for digits", "data.root="]),
        pytest.param(
            [*IMAGES, "data.val_fraction=0"],
            ["best.pt", "data.val_fraction=0.02", "data.root/val/<class>/"],
            marks=needs_image_folders,
        ),
        pytest.param(
            [*IMAGES, "data.test_fraction=0"],
            ["data.test_fraction=0.02", "data.root/test/<class>/"],
            marks=needs_image_folders,
        ),
        pytest.param(["model=sequence"], ["${data.vocabulary}", "model.vocabulary=<value>"], marks=NEEDS_TEXT),
        pytest.param(
            [*TEXTS, "data.class_folders=[neg,neg]"],
            ["names neg more than once", "name each class folder once"],
            marks=NEEDS_TEXT,
        ),
    ],
)
def test_messages_show_the_bad_value_and_the_way_out(compose_config, overrides, fragments):
    key, message = next(iter(problems(compose_config(overrides)).items()))
    message = f"{key}: {message}"
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_all_problems_are_found_in_one_pass_and_reported_on_one_line(compose_config):
    cfg = compose_config(["optimizer.lr=-1", "data.batch_size=0", "augmentation.name=3", "data.mean=[0.1,0.2]"])
    assert list(problems(cfg)) == ["data.batch_size", "optimizer.lr", "augmentation.name", "data.mean"]
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    line = str(error.value)
    assert error.value.key == "data.batch_size" and "\n" not in line
    assert "; also optimizer.lr: must be a number > 0, got -1" in line and "; also augmentation.name:" in line


def test_a_contradiction_between_bad_values_is_not_reported():
    """data.channels=0 is wrong on its own; comparing the statistics with it would add noise."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF.resolve()), version_base=None):
        cfg = compose("config", overrides=["data.channels=0", "data.mean=[0.1,0.2]"])
    GlobalHydra.instance().clear()
    assert list(problems(cfg)) == ["data.channels"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        pytest.param(["data=imagefolder"], "data.root", marks=needs_image_folders),
    ],
)
def test_required_keys_say_how_to_pass_them(compose_config, overrides, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides))
    assert str(error.value).startswith(f"{key}: is required; pass {key}=...")


def test_one_value_for_all_channels_is_accepted(compose_config):
    validate(compose_config(["data.mean=[0.5]"]))
    validate(compose_config(["data.channels=3", "data.mean=[0.5]", "data.std=[0.25]"]))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["data=imagefolder", "data.root=/data/images", "augmentation=basic"], marks=needs_image_folders),
        ["augmentation=basic", "data.mirror_changes_label=false"],  # your digits are mirror-safe: you say so
        ["augmentation=basic", "augmentation.horizontal_flip=false"],
    ],
)
def test_flips_are_allowed_where_the_mirror_image_keeps_its_label(compose_config, overrides):
    validate(compose_config(overrides))


# ---- before anything is built ------------------------------------------------------------------


@needs_image_folders
def test_a_bad_config_fails_before_any_data_model_or_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    returncode, _, stderr = run_here(
        "train.py",
        f"hydra.run.dir={run_dir}",
        "data=imagefolder",
        f"data.root={tmp_path / 'nonexistent'}",
        "optimizer.lr=-1",
    )
    assert returncode == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: optimizer.lr: must be a number > 0, got -1"], stderr  # not the data folder's
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


def test_importing_the_schema_stays_light():
    code = (
        "import sys, trainkit.config.validation; heavy = ('torchvision', 'timm', 'wandb', 'matplotlib', 'optuna'); "
        "print([m for m in sys.modules if m.split('.')[0] in heavy])"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


# ---- settings the chosen options ignore: one warning each, never an error ------------------------


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["data.num_workers=4"], "data.num_workers=4 is ignored"),
        (["data.root=/data"], "data.root=/data is ignored"),
        (["data.download=true"], "data.download=true is ignored"),  # the digits ship with scikit-learn
        pytest.param(
            ["data=imagefolder", "data.root=/data/images", "data.download=true"],
            "data.download=true is ignored",
            marks=needs_image_folders,
        ),
        (["scheduler=constant", "scheduler.warmup_start_factor=0.1"], "scheduler.warmup_start_factor is ignored"),
    ],
)
def test_an_ignored_setting_is_one_warning(compose_config, caplog, overrides, fragment):
    cfg = compose_config(overrides)
    with caplog.at_level(logging.WARNING, logger="trainkit.config.validation"):
        validate(cfg)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(fragment), warnings


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        pytest.param(["data=imagefolder", "data.root=/data/images"], marks=needs_image_folders),
        pytest.param(
            ["data=imagefolder", "data.root=/data/images", "data.num_workers=3", "data.pin_memory=false"],
            marks=needs_image_folders,
        ),
        ["data.num_workers=auto"],  # in-memory data: auto means none, nothing to warn about
    ],
)
def test_defaults_and_used_settings_warn_about_nothing(compose_config, overrides):
    assert ignored_keys(compose_config(overrides)) == []


# ---- cli.one_line -----------------------------------------------------------------------------


def test_unknown_group_option_is_one_line_listing_the_options(compose_config):
    with pytest.raises(MissingConfigException) as error:
        compose_config(["data=nope"])
    line = one_line(error.value)
    assert "\n" not in line
    assert line.startswith("data=nope: ")
    for option in (p.stem for p in (CONF / "data").glob("*.yaml")):
        assert option in line


def test_misspelt_key_is_one_line_with_a_suggestion(compose_config):
    with pytest.raises(Exception) as error:
        compose_config(["optimizer.lrr=0.1"])
    line = one_line(error.value)
    assert "\n" not in line
    assert line.startswith("optimizer.lrr: ")
    assert "did you mean optimizer.lr?" in line
    assert "+optimizer.lrr=" in line  # and how to add a key on purpose


def test_misspelt_top_level_key_suggests_the_real_one(compose_config):
    with pytest.raises(Exception) as error:
        compose_config(["sed=1"])
    line = one_line(error.value)
    assert "\n" not in line and "sed" in line and "did you mean seed?" in line


def test_config_error_wrapped_by_instantiation_exception_gives_its_own_text():
    config_error = ConfigError("model.name", "unknown model 'resnet9000'; choose one of cnn, timm, torchvision")
    try:
        try:
            raise config_error
        except ConfigError as cause:
            raise InstantiationException("Error in call to target 'trainkit.models.build':\nmore\ndetail") from cause
    except InstantiationException as wrapped:
        assert one_line(wrapped) == str(config_error)


def test_config_error_is_returned_as_is():
    assert one_line(ConfigError("optimizer.lr", "must be > 0, got 0")) == "optimizer.lr: must be > 0, got 0"


def test_any_other_multiline_error_is_flattened_to_one_line():
    try:
        try:
            raise ValueError("first line\n\n   second line")
        except ValueError as cause:
            raise RuntimeError("outer\nproblem") from cause
    except RuntimeError as error:
        line = one_line(error)
    assert "\n" not in line
    assert line == "outer problem first line second line"


def test_a_config_error_is_recognized_through_the_wrappers_around_it():
    from trainkit.errors import caused_by_config_error

    try:
        try:
            raise ConfigError("model.name", "no such model")
        except ConfigError as inner:
            raise InstantiationException("Error in call to target") from inner
    except InstantiationException as wrapped:
        assert caused_by_config_error(wrapped)
    assert not caused_by_config_error(RuntimeError("a bug"))


def test_ctrl_c_in_a_script_without_stop_handlers_is_one_line_and_exit_130(monkeypatch, capsys):
    """eval.py has no stop handlers of train.py's: a Ctrl-C there is a line, not a KeyboardInterrupt traceback."""
    from trainkit import cli

    def interrupted_main():
        raise KeyboardInterrupt

    monkeypatch.setattr(sys, "argv", ["eval.py"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # restored afterwards: cli.run sets it to 1 for Hydra
    with pytest.raises(SystemExit) as stop:
        cli.run(interrupted_main, resumes=False)
    assert stop.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C): stopped before the end; what was written so far stays\n"


AUTO_KEPT = pytest.mark.skipif(not template_has("trainer._checks_.micro_batch_auto"), reason="trimmed: no auto")


@pytest.mark.parametrize("size", ["16", pytest.param("auto", marks=AUTO_KEPT)])
def test_a_task_whose_loss_couples_the_batch_refuses_micro_batches_fixed_or_auto(size):
    """Parts of a batch would train on another loss (fewer negatives): the config check says so, for a size and auto."""
    coupled = "task._target_=tasks_for_tests.InBatchContrastive"
    assert problems(composed(coupled, f"trainer.micro_batch_size={size}")) == {
        "trainer.micro_batch_size": f"is {size}, but InBatchContrastive's loss couples the samples of a batch "
        f"(couples_batch: each sample's loss reads the others), so micro-batches would train on another loss; set "
        f"trainer.micro_batch_size=null (a smaller data.batch_size or precision=bf16 saves memory)"
    }
    assert problems(composed(coupled)) == {}
    assert problems(composed(f"trainer.micro_batch_size={size}")) == {}  # classification's loss does not couple


def test_settings_the_chosen_options_do_not_read_are_said_in_one_line_each(compose_config):
    from trainkit.config.validation import unread_settings

    regression = compose_config(["~task", "+task._target_=tasks_for_tests.Regression", *TABLE])
    assert unread_settings(regression, chosen=()) == {}  # the regularization group's own recipe: not yours to unset
    said = unread_settings(regression, chosen=["regularization.label_smoothing"])
    assert said == {"regularization.label_smoothing": "tasks_for_tests.Regression takes no label smoothing"}
    assert unread_settings(compose_config(), chosen=["regularization.label_smoothing"]) == {}  # classification's


def test_a_model_reading_keys_the_data_lacks_is_offered_only_what_the_data_says_suits_it(compose_config):
    table = [override for override in TABLE if not override.startswith("model.")]  # model=cnn reads data.channels
    message = problems(compose_config(table))["model.in_channels"]
    assert "has no data.channels" in message and "(made for" not in message  # a table names no model it suits
    if template_has("data/textfolder.yaml"):
        texts = problems(compose_config(["data=textfolder", "data.root=/data/texts"]))["model.in_channels"]
        assert "pick model=sequence" in texts and "(made for data=textfolder)" in texts  # TextData.suits
