"""What a run set and what it filled in, recorded apart (trainkit.config.filled_in)."""

from omegaconf import OmegaConf

from trainkit.config.filled_in import as_set, record_filled_in


def composed():
    """A config as Hydra composes it: keys left to the run (null, auto) and one that follows another."""
    return OmegaConf.create(
        {
            "seed": 1,
            "optimized_metric": None,
            "data": {"num_classes": None, "batch_size": 64},
            "model": {"num_labels": "${data.num_classes}"},
            "trainer": {"micro_batch_size": "auto"},
        }
    )


def test_a_run_records_what_it_filled_in_apart_from_what_was_set(tmp_path):
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(composed(), tmp_path / ".hydra" / "config.yaml")
    run = composed()
    run.optimized_metric, run.data.num_classes, run.data.batch_size, run.trainer.micro_batch_size = "val/acc", 3, 96, 8
    record_filled_in(run, tmp_path)
    assert OmegaConf.to_container(OmegaConf.load(tmp_path / ".hydra" / "filled_in.yaml")) == {
        "optimized_metric": "val/acc",
        "data.num_classes": 3,
        "data.batch_size": 96,  # a searched batch size: not null as set, filled in all the same
        "model.num_labels": 3,  # follows data.num_classes
        "trainer.micro_batch_size": 8,
    }
    record_filled_in(run, tmp_path / "elsewhere")  # no .hydra/ record (train(cfg)): nothing written
    assert not (tmp_path / "elsewhere").exists()


def test_a_resume_records_its_config_as_set(tmp_path):
    """The checkpoint's config holds what the run filled in; the config a resume records puts back what was set."""
    checkpoint = {"seed": 1, "optimized_metric": "val/acc", "data": {"num_classes": 3, "batch_size": 96},
                  "model": {"num_labels": 3}, "trainer": {"micro_batch_size": 8}}  # fmt: skip
    (tmp_path / ".hydra").mkdir()
    assert OmegaConf.to_container(as_set(OmegaConf.create(checkpoint), composed(), tmp_path)) == {
        **checkpoint,  # recorded before filled_in.yaml: the keys composed leaves null or auto
        "optimized_metric": None,
        "data": {"num_classes": None, "batch_size": 96},
        "model": {"num_labels": None},
        "trainer": {"micro_batch_size": "auto"},
    }
    OmegaConf.save(
        OmegaConf.create({"data.batch_size": 96, "optimized_metric": "val/acc"}), tmp_path / ".hydra" / "filled_in.yaml"
    )
    assert OmegaConf.to_container(as_set(OmegaConf.create(checkpoint), composed(), tmp_path)) == {
        **checkpoint,  # the keys the run recorded it filled in
        "optimized_metric": None,
        "data": {"num_classes": 3, "batch_size": 64},
    }
