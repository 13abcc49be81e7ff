"""Image folders as people have them: odd formats and modes, stray files, unreadable images."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image, features

from trainkit.data import build_data
from trainkit.data.class_folders import class_names, walk_files
from trainkit.data.image_files import decode, image_extensions
from trainkit.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"
CPU = torch.device("cpu")


def folder_cfg(root: Path, **overrides):
    cfg = OmegaConf.load(CONF / "imagefolder.yaml")
    settings = {"root": str(root), "image_size": 8, "num_workers": 0, "batch_size": 4, "val_fraction": 0.2}
    for key, value in {**settings, "test_fraction": 0.2, **overrides}.items():
        cfg[key] = value
    return cfg


def write_classes(root: Path, per_class: int = 5) -> None:
    for label, name in enumerate(["a", "b"]):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for index in range(per_class):
            Image.new("RGB", (10, 12), (100 * label, 50, 200)).save(folder / f"{index}.png")


def odd_images() -> dict[str, Image.Image]:
    """file name -> image, one of each mode and extension that needs care."""
    gradient = np.linspace(0, 255, 16 * 16).reshape(16, 16).astype(np.uint8)
    palette = Image.fromarray(gradient).convert("P")
    palette.info["transparency"] = 0
    images = {
        "grey.png": Image.fromarray(gradient, "L"),
        "alpha.png": Image.fromarray(np.dstack([gradient] * 4), "RGBA"),
        "palette.png": palette,
        "palette.gif": Image.fromarray(gradient).convert("P"),
        "deep.png": Image.fromarray(gradient.astype(np.uint16) * 256 + 255),  # 16-bit greyscale, I;16
        "grey_alpha.png": Image.fromarray(np.dstack([gradient] * 2), "LA"),
        "UPPER.JPG": Image.fromarray(np.dstack([gradient] * 3), "RGB"),
        "cmyk.jpeg": Image.fromarray(np.dstack([gradient] * 3), "RGB").convert("CMYK"),
        "bitmap.bmp": Image.fromarray(gradient, "L"),
        "scan.tiff": Image.fromarray(gradient, "L").convert("1"),
        "portable.ppm": Image.fromarray(np.dstack([gradient] * 3), "RGB"),
    }
    if features.check("webp"):
        images["photo.webp"] = Image.fromarray(np.dstack([gradient] * 3), "RGB")
    return images


def test_every_mode_and_format_loads_into_the_configured_channels(tmp_path):
    written = odd_images()
    for name, image in written.items():
        if name == "palette.png":
            image.save(tmp_path / name, transparency=0)
        else:
            image.save(tmp_path / name)
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")  # really 16-bit on disk
    for name in written:
        for channels, mode in ((1, "L"), (3, "RGB")):
            pixels = decode(str(tmp_path / name), mode, 8)
            assert pixels.shape == (channels, 8, 8) and pixels.dtype == torch.uint8, name
    # 16-bit values are scaled to 8 bits, not clipped to white (Pillow's own convert clips).
    deep = decode(str(tmp_path / "deep.png"), "L", 16)
    grey = decode(str(tmp_path / "grey.png"), "L", 16)
    assert (deep.int() - grey.int()).abs().max() <= 1 and deep.float().std() > 50


def test_sub_folders_are_read_hidden_and_non_image_entries_ignored_with_a_count(tmp_path, caplog):
    write_classes(tmp_path)
    (tmp_path / "train" / "a" / ".DS_Store").write_bytes(b"\0\1")
    (tmp_path / "train" / "a" / "._0.png").write_bytes(b"resource fork")
    (tmp_path / "train" / "a" / ".git").mkdir()  # a hidden folder: counted once, not entered
    Image.new("RGB", (9, 9)).save(tmp_path / "train" / "a" / ".git" / "object.png")
    (tmp_path / "train" / "b" / "notes.txt").write_text("labels by hand")
    (tmp_path / "train" / "b" / "extra" / "2019").mkdir(parents=True)  # a sub-folder of a class: read
    Image.new("RGB", (9, 9)).save(tmp_path / "train" / "b" / "extra" / "2019" / "later.png")
    Image.new("RGB", (9, 9)).save(tmp_path / "train" / "b" / "SHOUTING.PNG")
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "train" / "README.txt").write_text("my photos")
    with caplog.at_level(logging.INFO, logger="trainkit.data"):
        data = build_data(folder_cfg(tmp_path, val_fraction=0.1, test_fraction=0.1), CPU, seed=0)
    listed = [path for loader in (data.train, data.val, data.test) for path, _ in loader.loader.dataset.samples]
    assert len(listed) == 12 and str(tmp_path / "train" / "b" / "extra" / "2019" / "later.png") in listed
    assert "ignored 3 hidden and 1 non-image entries" in caplog.text
    assert "ignored 2 entries that are not class folders" in caplog.text and data.num_classes == 2


def test_class_names_and_the_images_of_a_folder_are_sorted_and_skip_the_rest(tmp_path):
    write_classes(tmp_path, per_class=2)
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "train" / "a" / "notes.txt").write_text("labels by hand")
    (tmp_path / "train" / "b" / ".hidden.png").write_bytes(b"")
    Image.new("L", (4, 4)).save(tmp_path / "train" / "b" / "UPPER.JPG")
    assert class_names(tmp_path) == ["a", "b"] and class_names(tmp_path / "nowhere") == []
    found = [
        path.relative_to(tmp_path / "train").as_posix()
        for path in walk_files(tmp_path / "train", image_extensions())[0]
    ]
    assert found == ["a/0.png", "a/1.png", "b/0.png", "b/1.png", "b/UPPER.JPG"]


def break_two_images(root: Path) -> list[Path]:
    broken = [root / "train" / "a" / "0.png", root / "train" / "b" / "3.png"]
    broken[0].write_bytes(b"not a png at all")
    broken[1].write_bytes(broken[1].read_bytes()[:40])  # truncated: the header opens, the pixels fail
    return broken


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_unreadable_image_is_one_line_naming_it_and_the_way_out(tmp_path, num_workers):
    write_classes(tmp_path)
    broken = break_two_images(tmp_path)
    data = build_data(folder_cfg(tmp_path, num_workers=num_workers, val_fraction=0.1, test_fraction=0.1), CPU, seed=0)
    with pytest.raises(ConfigError) as error:  # from a worker too: not torch's multi-line RuntimeError
        for _ in data.train:
            pass
    line = str(error.value)
    assert "\n" not in line and error.value.key == "data.root"
    assert any(str(path) in line for path in broken) and "data.skip_bad_files=true" in line


def test_skip_bad_files_drops_them_from_their_batch_and_counts_them(tmp_path, caplog):
    write_classes(tmp_path)
    break_two_images(tmp_path)
    cfg = folder_cfg(tmp_path, skip_bad_files=True, num_workers=1, val_fraction=0.1, test_fraction=0.1, batch_size=8)
    data = build_data(cfg, CPU, seed=0)
    everything = {path for loader in (data.train, data.val, data.test) for path, _ in loader.loader.dataset.samples}
    assert len(everything) == 10
    seen, skipped, passes_with_bad_files = 0, 0, 0
    with caplog.at_level(logging.WARNING, logger="trainkit.data.loaders"):
        for loader in (data.train, data.val, data.test):
            for images, labels in loader:
                assert images.shape[1:] == (3, 8, 8) and len(images) == len(labels)
                seen += len(labels)
            skipped += len(loader.bad_files)
            passes_with_bad_files += bool(loader.bad_files)
    assert (seen, skipped) == (8, 2)
    reports = [record.getMessage() for record in caplog.records if "unreadable" in record.getMessage()]
    assert len(reports) == passes_with_bad_files  # one line a pass (an epoch), not one a file
    assert all("data.skip_bad_files=true" in report for report in reports)


@pytest.mark.slow  # trains in this process (run_train)
def test_train_py_stops_on_an_unreadable_image_with_one_line_and_exit_1(tmp_path, run_train):
    write_classes(tmp_path / "images", per_class=6)
    (tmp_path / "images" / "train" / "b" / "2.png").write_bytes(b"\x89PNG broken")
    run = run_train(
        "data=imagefolder",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=8",
        "data.num_workers=1",
        "data.batch_size=4",
        "debug=fast",
        "print_config=false",
        check=False,
    )
    last_line = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last_line.startswith("error: data.root: cannot read image '")
    assert "2.png" in last_line and "data.skip_bad_files=true" in last_line and "Traceback" not in run.stderr


def test_a_val_split_with_an_empty_class_folder_is_one_warning(tmp_path, caplog):
    write_classes(tmp_path)
    for split, name in [("val", "a"), ("test", "a"), ("test", "b")]:
        (tmp_path / split / name).mkdir(parents=True)
        Image.new("RGB", (9, 9)).save(tmp_path / split / name / "0.png")
    (tmp_path / "val" / "b").mkdir()
    with caplog.at_level(logging.WARNING, logger="trainkit.data.class_folders"):
        build_data(folder_cfg(tmp_path), CPU, seed=0)
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [
        f"'{tmp_path / 'val'}' holds no file of class b, which train/ has: its metrics cover a alone "
        "(a model that always answers a scores val/acc 1.0); add some to it"
    ]


def test_a_root_that_is_the_train_folder_itself_names_its_parent(tmp_path):
    write_classes(tmp_path / "images")
    with pytest.raises(ConfigError) as error:
        build_data(folder_cfg(tmp_path / "images" / "train"), CPU, seed=0)
    assert error.value.message.endswith(
        f"expected {tmp_path}/images/train/train/<class>/<images>; it looks like a split's folder itself: "
        f"set data.root={tmp_path / 'images'}"
    )


def test_a_folder_with_one_class_is_refused_in_one_line(tmp_path, run_train):
    folder = tmp_path / "images" / "train" / "cats"
    folder.mkdir(parents=True)
    for index in range(6):
        Image.new("RGB", (10, 12), (index, 50, 200)).save(folder / f"{index}.png")
    with pytest.raises(ConfigError, match=r"has one class folder \(cats\); classification needs at least two"):
        build_data(folder_cfg(tmp_path / "images"), CPU, seed=0)
    run = run_train("data=imagefolder", f"data.root={tmp_path / 'images'}", "print_config=false", check=False)
    last_line = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last_line.startswith("error: data.root: '") and "one class folder" in last_line
    assert "Traceback" not in run.stderr
