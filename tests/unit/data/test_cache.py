"""Tests for trainkit.data.cache and scripts/preprocess.py: the offline cache of an image folder."""

import json
import shlex
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from conftest import ROOT
from helpers import load_script, record_run
from trainkit import runtime
from trainkit.data import build_data, make_data
from trainkit.data.cache import write_cache
from trainkit.data.image_files import decode
from trainkit.errors import ConfigError

CONF = ROOT / "conf" / "data"
CPU = torch.device("cpu")


def make_folder(root, per_class: int = 6) -> None:
    """Three classes of odd-sized RGB and greyscale PNGs and a JPEG: the resize and crop matter."""
    rng = np.random.default_rng(0)
    for label in range(3):
        folder = root / "train" / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            height, width = 9 + i, 13 + 2 * label
            if i == 0:
                Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8)).save(folder / "grey.png")
            elif i == 1:
                Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / "photo.jpg")
            else:
                Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def config(name: str, **overrides):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in {"image_size": 8, "batch_size": 4, "num_workers": 0, **overrides}.items():
        cfg[key] = value
    return cfg


def load_cache(cfg):
    """The data=cached splits, as build_data makes them."""
    return make_data(cfg).splits()


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """(image folder, cache dir, meta): the cache written by scripts/preprocess.py's main."""
    tmp = tmp_path_factory.mktemp("cache")
    make_folder(tmp / "images")
    preprocess = load_script("preprocess")
    args = [str(tmp / "cache"), f"data.root={tmp / 'images'}", "data.image_size=8", "--workers=0", "--no-progress"]
    assert preprocess.main(args) == 0
    return tmp / "images", tmp / "cache", json.loads((tmp / "cache" / "meta.json").read_text())


def test_the_cache_holds_the_pixels_the_file_loader_decodes(cached):
    images_root, cache, meta = cached
    assert meta["image_size"] == 8 and meta["channels"] == 3 and meta["classes"] == ["class0", "class1", "class2"]
    splits = load_cache(config("cached", root=str(cache)))
    files = build_data(config("imagefolder", root=str(images_root)), CPU, seed=0)
    for split, loader in zip((splits.train, splits.val, splits.test), (files.train, files.val, files.test)):
        images, labels = split
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 8, 8) and labels.dtype == torch.int64
        # Row i is the i-th file of the same split data=imagefolder carves, decoded exactly as it decodes.
        samples = loader.loader.dataset.samples
        assert [label for _, label in samples] == labels.tolist()
        expected = torch.stack([decode(path, "RGB", 8) for path, _ in samples])
        assert torch.equal(images, expected)
    names = (cache / "train_files.txt").read_text().splitlines()
    assert names == [path for path, _ in files.train.loader.dataset.samples]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"image_size": 16}, "data.image_size"),
        ({"channels": 1}, "data.channels"),
        ({"num_classes": 5}, "data.num_classes"),
        ({"val_fraction": 0.2}, "data.val_fraction"),
    ],
)
def test_a_cache_made_with_other_settings_is_refused_naming_the_key(cached, override, key):
    _, cache, _ = cached
    with pytest.raises(ConfigError) as error:
        load_cache(config("cached", root=str(cache), **override))
    assert error.value.key == key and "\n" not in str(error.value)
    assert f"{key}={next(iter(override.values()))}" in str(error.value)  # the remake command names the value
    assert f"data.image_size={override.get('image_size', 8)}" in str(error.value)  # and the cache's other settings


@pytest.mark.parametrize(
    ("override", "remade_with"),
    [({"val_fraction": 0.3}, {"val_fraction": 0.3}), ({"channels": 1, "mean": [0.5], "std": [0.25]}, {"channels": 1})],
)
def test_the_printed_remake_command_remakes_the_same_cache_with_the_one_change(cached, tmp_path, override, remade_with):
    """Pasted into a shell (here into another directory), it keeps the cache's 8 px, not preprocess.py's 224."""
    _, cache, meta = cached
    with pytest.raises(ConfigError) as error:
        load_cache(config("cached", root=str(cache), **override))
    command = shlex.split(str(error.value).split("or remake it: python scripts/preprocess.py ")[1])
    assert command[0] == str(cache)
    args = [str(tmp_path / "remade"), *command[1:], "--workers=0", "--no-progress"]
    assert load_script("preprocess").main(args) == 0
    remade = json.loads((tmp_path / "remade" / "meta.json").read_text())
    assert {key: remade[key] for key in ("image_size", "channels", "val_fraction")} == {
        "image_size": 8,
        "channels": meta["channels"],
        "val_fraction": meta["val_fraction"],
        **remade_with,
    }


def test_a_folder_that_is_not_a_cache_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"preprocess\.py") as error:
        load_cache(config("cached", root=str(tmp_path)))
    assert error.value.key == "data.root"


def test_an_interrupted_write_leaves_no_cache(cached, tmp_path, monkeypatch):
    images_root, _, _ = cached
    monkeypatch.setattr(np, "save", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        write_cache(make_data(config("imagefolder", root=str(images_root))), tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "meta.json").exists()


def test_preprocess_interrupted_over_a_cache_says_so_in_one_line_and_the_old_cache_stays(
    cached, tmp_path, monkeypatch, capsys
):
    images_root, cache, _ = cached
    shutil.copytree(cache, tmp_path / "cache")
    before = {path.name: path.read_bytes() for path in (tmp_path / "cache").iterdir()}
    real_save = np.save
    saved = []

    def ctrl_c_in_the_second_split(*args, **kwargs):  # half way: the train split written, Ctrl-C
        saved.append(args[0])
        if len(saved) == 2:
            raise KeyboardInterrupt
        real_save(*args, **kwargs)

    monkeypatch.setattr(np, "save", ctrl_c_in_the_second_split)
    args = [str(tmp_path / "cache"), f"data.root={images_root}", "data.image_size=8", "--workers=0", "--no-progress"]
    assert load_script("preprocess").main(args) == 130
    assert capsys.readouterr().err == f"interrupted: {tmp_path / 'cache'}: the cache there is as it was\n"
    assert {path.name: path.read_bytes() for path in (tmp_path / "cache").iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cache"]  # no partial cache left beside it
    load_cache(config("cached", root=str(tmp_path / "cache")))  # still a valid cache


def test_data_cached_trains_end_to_end_on_the_cache_s_images(cached, tmp_path, monkeypatch):
    """In process: the loop trains on the cache's training array, each image once an epoch."""
    _, cache, _ = cached
    cached_train = [image.numpy().tobytes() for image in torch.from_numpy(np.load(cache / "train_images.npy"))]
    overrides = ["data=cached", f"data.root={cache}", "data.image_size=8", "data.batch_size=4", "debug=fast"]
    one_epoch = ["trainer.max_epochs=1", "trainer.limit_train_batches=null", "device=cpu", "print_config=false"]
    recording = record_run(tmp_path, monkeypatch, *overrides, *one_epoch)
    seen = [image.numpy().tobytes() for images, _ in recording.transformed for image in images]
    assert sorted(seen) == sorted(cached_train)
    assert recording.summary["epochs"] == 1 and "test/acc" in recording.summary["test"]


def test_benchmark_dataloader_prints_a_table_and_a_recommendation(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runtime, "available_cores", lambda: 1)  # 1x, 1.5x, 2x the cores: 1, 2, 2 workers
    benchmark = load_script("benchmark_dataloader")
    args = ["--make-folder", "24", "--out", str(tmp_path), "--batches", "2", "--warmup", "1", "--max-workers", "0"]
    assert benchmark.main([*args, "data.image_size=8", "data.batch_size=4"]) == 0
    printed = capsys.readouterr().out
    for workers in (0, 1, 2):  # --max-workers 0, and the articles' counts
        assert f"| files | `data.num_workers={workers}` |" in printed
    assert "| files | `data.num_workers=3` |" not in printed
    assert "| cached | `data=cached on cpu" in printed
    assert "\nfile loader: data.num_workers=" in printed
    recommendation = printed.strip().splitlines()[-1]
    assert recommendation.startswith("recommendation: data=") and "\n" not in recommendation
    assert (tmp_path / "benchmark_dataloader.png").stat().st_size > 0
    assert (tmp_path / "benchmark_dataloader.md").read_text().strip().endswith(recommendation)


def test_benchmark_dataloader_draws_a_log_axis_with_each_bar_s_number():
    benchmark = load_script("benchmark_dataloader")
    results = [("files", "data.num_workers=0", 210.0), ("files", "data.num_workers=2", 400.0), ("cached", "c", 21000.0)]
    axes = benchmark.draw(results).axes[0]
    assert axes.get_xscale() == "log"
    assert [text.get_text() for text in axes.texts] == ["210", "400", "21,000"]


def test_benchmark_dataloader_refuses_a_warmup_longer_than_the_folder_before_making_the_cache(tmp_path, capsys):
    benchmark = load_script("benchmark_dataloader")
    args = ["--make-folder", "24", "--out", str(tmp_path), "--warmup", "10", "data.image_size=8", "data.batch_size=4"]
    with pytest.raises(SystemExit) as stop:
        benchmark.main(args)
    message = str(stop.value)
    assert message.startswith("error: --warmup 10 leaves none of the ") and "\n" not in message
    assert "training batches" in message and "--warmup " in message.split(";")[1]
    assert not (tmp_path / "cache").exists()  # refused before the cache was made


def test_benchmark_dataloader_recommends_by_the_articles_rule():
    benchmark = load_script("benchmark_dataloader")
    assert benchmark.worker_counts(2, 8) == [0, 1, 2, 8, 12, 16]  # always 1x, 1.5x and 2x the cores
    assert benchmark.worker_counts(4, 2) == [0, 1, 2, 3, 4]
    rates = {0: 100.0, 4: 400.0, 8: 800.0, 12: 830.0, 16: 700.0, 20: 2000.0}
    assert benchmark.recommended_workers(rates, 8) == 8  # 1.5x is under 5% faster: the cores; 20 is above 2x
    assert benchmark.recommended_workers({**rates, 12: 900.0}, 8) == 12  # 1.5x pays
    assert benchmark.recommended_workers({**rates, 4: 1000.0}, 8) == 4  # fewer, measured faster
    assert benchmark.recommended_workers({**rates, 0: 5000.0}, 8) == 8  # never 0: the step would wait for decoding
    assert benchmark.workers_advice(rates, 8).startswith("data.num_workers=auto (8 workers, 1x the 8 cores")
    assert benchmark.workers_advice({**rates, 12: 900.0}, 8).startswith("data.num_workers=12 (1.5x the 8 cores: 1.12x")


def test_a_dataset_too_big_for_the_gpu_stays_on_the_host_with_pinned_batches(cached, monkeypatch, caplog):
    _, cache, _ = cached
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10**9))  # 1000 bytes free
    data = build_data(config("cached", root=str(cache)), torch.device("cuda"), seed=0)
    assert data.train.images.device == CPU and data.train.pin_memory and data.test.pin_memory
    assert "stays in host memory" in caplog.text


@pytest.mark.skipif(not (ROOT / "tests/unit/data/test_folds.py").is_file(), reason="this clone has no folds (trimmed)")
def test_a_cache_folds_the_rows_it_carved_from_train_and_refuses_a_val_folder_of_its_own(tmp_path, capsys):
    from unit.data.test_folds import check_every_fold, image_folder, option, splits_of

    preprocess = load_script("preprocess")
    for name, splits in (("carved", ("train",)), ("own", ("train", "val"))):
        image_folder(tmp_path / f"{name}-images", splits)
        args = [str(tmp_path / name), f"data.root={tmp_path / f'{name}-images'}", "data.image_size=6"]
        assert preprocess.main([*args, "data.val_fraction=0.2", "data.test_fraction=0.2", "--no-progress"]) == 0
    keys = dict(image_size=6, val_fraction=0.2, test_fraction=0.2)
    check_every_fold(option("cached", root=str(tmp_path / "carved"), **keys))
    folded_cache = [str(tmp_path / "folded"), f"data.root={tmp_path / 'carved-images'}", "data.folds=3", "data.fold=0"]
    capsys.readouterr()
    assert preprocess.main(folded_cache) == 1 and not (tmp_path / "folded").exists()  # folds are cut when training
    assert capsys.readouterr().err.startswith("error: data.folds: is 3, but a cache holds the splits as carved;")
    with pytest.raises(ConfigError, match=r"^data\.folds: is 3, but the cache .* a val split of its own"):
        splits_of(option("cached", root=str(tmp_path / "own"), **keys), folds=3, fold=0)
