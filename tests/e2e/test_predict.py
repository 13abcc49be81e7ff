"""eval.py's predict= end to end (the predict row of docs/features.md): the predictions of a run's tested weights
for a folder or file of images, a table's rows or a dict batch's images, written as predictions.csv, and the one-line
refusals of what it cannot read. Texts, masks and a language model's text file: their rows' tests."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_any_batch import CAPTIONED_RUN, DICT_RUN
from test_beyond_images import TABLE_RUN
from test_eval import CLASSIFICATION, Evaluation, save_image, train, write_untrained_run

from conftest import ROOT, TrainRun
from helpers import needs_file_data, needs_image_folders, nothing_left
from trainkit.data.datasets import read_digits
from trainkit.errors import ConfigError
from trainkit.prediction import Evaluated, PredictionWriter, predict_folder, predicting


@pytest.fixture(scope="module")
def classification(tmp_path_factory) -> TrainRun:
    return train(tmp_path_factory.mktemp("classification") / "run", *CLASSIFICATION)


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory) -> Path:
    return write_untrained_run(tmp_path_factory.mktemp("untrained") / "run")


@pytest.mark.slow  # trains (once for the module)
def test_predict_writes_one_row_per_image(classification, tmp_path):
    from PIL import Image

    pixels, labels = read_digits()
    folder = tmp_path / "images"
    (folder / "more").mkdir(parents=True)
    for i in range(12):  # digits as 8-bit greyscale PNGs, some in a sub-folder
        image = Image.fromarray(np.round(pixels[i].reshape(8, 8) * 255 / 16).astype(np.uint8), mode="L")
        image.save(folder / ("more" if i % 3 == 0 else ".") / f"{i:02d}.png")
    (folder / "notes.txt").write_text("not an image")
    (folder / ".hidden.png").write_bytes(b"")
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={classification.run_dir}", f"predict={folder}")
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    lines = (tmp_path / "out" / "predictions.csv").read_text().splitlines()
    assert lines[0] == "file,class,probability" and len(lines) == 13
    rows = [line.split(",") for line in lines[1:]]
    assert sorted(name for name, _, _ in rows) == sorted(
        f"{'more/' if i % 3 == 0 else ''}{i:02d}.png" for i in range(12)
    )
    assert all(int(label) in range(10) and 0 < float(probability) <= 1 for _, label, probability in rows)
    right = sum(int(label) == labels[int(Path(name).stem)] for name, label, _ in rows)
    assert right >= 10, rows  # the model reads the PNGs as it read its training digits (measured: 11 of 12)
    assert "predictions for 12 images" in evaluation.stdout


@needs_image_folders
def test_predict_names_an_image_folders_classes_without_its_data_and_skips_what_it_cannot_read(tmp_path):
    """The checkpoint keeps the class names: predicting on another machine, without the training folder, names them.
    An image it cannot read is one line, or skipped under data.skip_bad_files=true; what is skipped is named."""
    from PIL import Image

    for index in range(24):  # two classes: dark and bright 8 x 8 images
        folder = tmp_path / "images" / "train" / ("bright" if index % 2 else "dark")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (200 + index,) * 3 if index % 2 else (index,) * 3).save(folder / f"{index}.png")
    image_folder = ("data=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8", "data.num_workers=0")
    run = train(tmp_path / "run", *image_folder, "trainer.max_epochs=1", "print_config=false")
    shutil.move(tmp_path / "images", tmp_path / "elsewhere")  # the data is gone
    (tmp_path / "new").mkdir()
    Image.new("RGB", (8, 8), (250, 250, 250)).save(tmp_path / "new" / "white.png")
    (tmp_path / "new" / "broken.png").write_bytes(b"not a png")
    (tmp_path / "new" / "notes.txt").write_text("not an image")
    refused = Evaluation(tmp_path / "out", f"checkpoint={run.run_dir}", f"predict={tmp_path / 'new'}")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1, refused.stderr
    assert errors[0].startswith(f"error: predict: cannot read '{tmp_path / 'new' / 'broken.png'}' (")
    assert errors[0].endswith("fix or remove it, or pass data.skip_bad_files=true to skip it")
    evaluation = Evaluation(
        tmp_path / "out", f"checkpoint={run.run_dir}", f"predict={tmp_path / 'new'}", "data.skip_bad_files=true"
    )
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    lines = (tmp_path / "out" / "predictions.csv").read_text().splitlines()
    assert lines[0] == "file,class,probability" and len(lines) == 2 and lines[1].startswith("white.png,")
    assert lines[1].split(",")[1] in ("bright", "dark")  # a class folder's name, not its label number
    assert "1 file(s) not read (hidden, or not images): notes.txt" in evaluation.stdout
    assert "skipped 1 unreadable file(s) (data.skip_bad_files=true): broken.png" in evaluation.stdout


def test_predict_takes_a_single_image_file(untrained_run, tmp_path):
    save_image(tmp_path / "digit.png", 8, 8)
    evaluation = Evaluation(tmp_path / "out", f"checkpoint={untrained_run}", f"predict={tmp_path / 'digit.png'}")
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    lines = (tmp_path / "out" / "predictions.csv").read_text().splitlines()
    assert lines[0] == "file,class,probability" and len(lines) == 2 and lines[1].startswith("digit.png,")
    assert "predictions for 1 image " in evaluation.stdout


def test_eval_writes_a_vector_a_sample_as_one_column():
    files = [Path("folder/a"), Path("folder/b")]
    writer = PredictionWriter(Path("unused"), Path("folder"), files, [])
    scores, values = torch.tensor([[0.5, 1.0], [2.0, -1.0]]), torch.tensor([1.5, 2.5])
    writer.write({"scores": scores, "value": values}, files, [(8, 8), (8, 8)])
    assert writer.rows == [
        {"file": "a", "scores": "0.5 1", "value": 1.5},
        {"file": "b", "scores": "2 -1", "value": 2.5},
    ]


def test_predict_reads_a_csv_or_npy_of_feature_rows_as_the_table_s_data_option_says(tmp_path):
    """DigitsTable's predict= hook (prediction_files, read_for_prediction): each row of a CSV (its header skipped) or
    a .npy file predicted as the run's model predicts the same features; before, predict= read images only."""
    import numpy as np

    from conftest import run_here
    from models_for_tests import TableNet
    from trainkit.data.datasets import read_digits

    run_dir = tmp_path / "run"
    returncode, _, stderr = run_here("train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *TABLE_RUN)
    assert returncode == 0, stderr[-4000:]
    pixels, _ = read_digits()
    rows = tmp_path / "rows"
    rows.mkdir()
    header = ",".join(f"pixel{i}" for i in range(64))
    (rows / "a.csv").write_text("\n".join([header, *(",".join(f"{v:g}" for v in row) for row in pixels[:3])]) + "\n")
    np.save(rows / "b.npy", pixels[3:5])
    (rows / "notes.txt").write_text("not read")
    out = tmp_path / "out"
    returncode, stdout, stderr = run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", f"predict={rows}")
    assert returncode == 0, stderr[-4000:]
    assert "predictions for 5 samples" in stdout and "1 file(s) not read (hidden, or not .csv, .npy files)" in stdout
    lines = (out / "predictions.csv").read_text().splitlines()
    assert lines[0] == "file,row,value"
    assert [line.rsplit(",", 1)[0] for line in lines[1:]] == ["a.csv,0", "a.csv,1", "a.csv,2", "b.npy,0", "b.npy,1"]
    model = TableNet(64, 1)
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"])
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(pixels[:5]).float() / 16).squeeze(1)
    assert [float(line.rsplit(",", 1)[1]) for line in lines[1:]] == pytest.approx(expected.tolist(), abs=1e-6)

    (rows / "c.csv").write_text("1,2,3\n")
    returncode, _, stderr = run_here(
        "eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run_dir}", f"predict={rows}"
    )
    assert returncode == 1 and stderr.strip().splitlines() == [
        f"error: predict: cannot read '{rows / 'c.csv'}' (ValueError: row 1 has 3 values, but the data's rows have "
        f"64); fix or remove it"
    ]
    assert nothing_left(tmp_path / "x")


@needs_file_data  # the data options that do not say are file data's
def test_predict_refuses_in_one_line_a_data_option_or_a_task_that_does_not_say_how(tmp_path):
    from omegaconf import OmegaConf, open_dict

    from conftest import composed

    sys.path.insert(0, str(ROOT))
    import eval as evaluation

    evaluated = Evaluated(evaluation.tested_task, evaluation.runs_data, evaluation.tested_model_on)  # eval.py's
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "a.png").write_bytes(b"")  # not read: the refusal comes first
    signals = composed(*DICT_RUN)  # dict batches of signals: no prediction_files
    captioned = composed(*CAPTIONED_RUN, "data._target_=file_data_for_tests.CaptionedDigitsWithoutPredictionBatch")
    for cfg in (signals, captioned):
        with open_dict(cfg):
            cfg.predict = str(tmp_path / "new")
    with pytest.raises(ConfigError, match=r"^predict: reads files as the data option says, but DigitSignals"):
        predict_folder(signals, tmp_path / "out", evaluated)
    with pytest.raises(ConfigError, match=r"makes dict batches \(image_entries\), .* give it a prediction_batch"):
        predict_folder(captioned, tmp_path / "out", evaluated)
    with pytest.raises(ConfigError, match=r"^task: Task \(task._target_\) says not what predict= writes of a sample"):
        bare_task = {"task": {"_target_": "trainkit.tasks.task.Task"}, "trainer": {"tta_flip": False}}
        predicting(OmegaConf.create(bare_task), evaluated)
