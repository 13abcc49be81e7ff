"""data=hf: a `datasets` dataset from local files the test writes (a jsonl file, parquet files with their own
splits, a save_to_disk folder), its classes, its splits or carved ones, tokens cached by datasets.map, the files in
the fingerprint, and the one-line errors. Nothing is downloaded."""

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import composed
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.errors import ConfigError

CPU = torch.device("cpu")


def reviews(count: int, seed: int) -> list[dict]:
    generator = random.Random(seed)
    return [
        {"review": ("great " if k % 2 else "awful ") * generator.randint(1, 30), "stars": "pos" if k % 2 else "neg"}
        for k in range(count)
    ]


def hf_data(tmp_path: Path, path: Path, *overrides: str, run_dir: Path | None = None):
    cfg = composed(
        "data=hf", f"data.path={path}", "data.text_column=review", "data.label_column=stars", "model=sequence",
        "data.num_workers=0", f"data.cache_dir={tmp_path / 'cache'}", "data.max_length=32", *overrides,
    )  # fmt: skip
    validate(cfg)
    return build_data(cfg.data, CPU, seed=0, run_dir=run_dir)


def test_a_jsonl_file_is_carved_by_class_and_named_in_the_fingerprint(tmp_path):
    file = tmp_path / "reviews.jsonl"
    file.write_text("\n".join(json.dumps(row) for row in reviews(100, seed=0)))
    data = hf_data(tmp_path, file, "data.max_tokens=64")
    assert data.class_names == ["neg", "pos"] and data.num_classes == 2 and data.vocabulary == 257
    assert [len(loader.loader.dataset) for loader in (data.train, data.val, data.test)] == [80, 10, 10]
    assert sorted(label for _, label in data.test.loader.dataset.samples) == [0] * 5 + [1] * 5  # stratified
    assert data.fingerprint["source"] == f"hf: reviews.jsonl ({file.stat().st_size} bytes)"
    for inputs, labels in data.train:
        assert inputs.numel() <= 64 and inputs.shape[1] <= 32  # the token budget, texts cut at max_length
        for row, label in zip(inputs.tolist(), labels.tolist(), strict=True):
            text = bytes(token - 1 for token in row if token).decode()  # bytes: b + 1, 0 pads
            assert text.startswith(["awful", "great"][label])  # each text with its own label

    file.write_text("\n".join(json.dumps(row) for row in reviews(101, seed=0)))  # a row more: other data
    assert hf_data(tmp_path, file).fingerprint["source"] != data.fingerprint["source"]


def test_parquet_files_keep_their_own_splits_and_a_classlabels_names(tmp_path):
    import datasets

    features = datasets.Features(
        {"review": datasets.Value("string"), "stars": datasets.ClassLabel(names=["neg", "pos"])}
    )
    folder = tmp_path / "parquet"
    folder.mkdir()
    for split, count in (("train", 40), ("validation", 8), ("test", 6)):
        rows = [{**row, "stars": int(row["stars"] == "pos")} for row in reviews(count, seed=len(split))]
        datasets.Dataset.from_list(rows, features=features).to_parquet(str(folder / f"{split}.parquet"))
    data = hf_data(tmp_path, folder, "data.tokenizer=bpe", "data.vocab_size=300", run_dir=tmp_path / "run")
    assert data.class_names == ["neg", "pos"]
    assert [len(loader.loader.dataset) for loader in (data.train, data.val, data.test)] == [40, 8, 6]  # its own
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file() and data.pad_id == 0
    inputs, _ = next(iter(data.test))
    assert data.tokenizer is not None and data.tokenizer.decode(inputs[0].tolist()).split()[0] in ("great", "awful")
    assert data.fingerprint["tokenizer"].startswith("bpe sha256:")
    assert data.fingerprint["source"].startswith("hf: test.parquet (")


def test_a_save_to_disk_folder_loads_and_its_tokens_are_cached(tmp_path):
    import datasets

    splits = {"train": reviews(30, seed=1), "test": reviews(10, seed=2)}
    saved = tmp_path / "saved"
    datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in splits.items()}).save_to_disk(
        str(saved)
    )
    data = hf_data(tmp_path, saved, "data.val_fraction=0.2")
    assert [len(loader.loader.dataset) for loader in (data.train, data.val, data.test)] == [24, 6, 10]
    cached = {path.name for path in saved.rglob("cache-*.arrow")}
    assert cached  # datasets.map wrote the tokens beside the saved dataset ...
    again = hf_data(tmp_path, saved, "data.val_fraction=0.2")
    assert {path.name for path in saved.rglob("cache-*.arrow")} == cached  # ... and read them back
    assert again.fingerprint == data.fingerprint


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.text_column=body"],
            r"^data.text_column: is 'body', not a column of '.*' \(its columns: review, stars\)",
        ),
        (["data.label_column=label"], r"^data.label_column: is 'label', not a column of"),
        (["data.path={missing}"], r"^data.path: '.*nowhere.jsonl' does not exist; give a data file or folder"),
    ],
)
def test_what_the_dataset_lacks_is_one_line(tmp_path, overrides, message):
    file = tmp_path / "reviews.jsonl"
    file.write_text("\n".join(json.dumps(row) for row in reviews(20, seed=0)))
    given = [override.format(missing=tmp_path / "nowhere.jsonl") for override in overrides]
    with pytest.raises(ConfigError, match=message):
        hf_data(tmp_path, file, *given)


def test_data_path_is_required_before_anything_is_read():
    with pytest.raises(ConfigError, match=r"data.path"):
        validate(composed("data=hf", "model=sequence"))


def test_folds_cut_the_training_pool_by_class_the_test_rows_stay_and_a_validation_split_refuses_them(tmp_path):
    file = tmp_path / "numbered.jsonl"
    rows = [
        {"review": f"row {k} " + ("great" if k % 3 else "awful"), "stars": "pos" if k % 3 else "neg"} for k in range(90)
    ]
    file.write_text("\n".join(json.dumps(row) for row in rows))

    def texts(dataset) -> list[str]:  # bytes: id b + 1, 0 pads
        return [bytes(token - 1 for token in dataset[i][0].tolist()).decode() for i in range(len(dataset))]

    runs = [hf_data(tmp_path, file, "data.folds=3", f"data.fold={fold}") for fold in range(3)]
    splits = [{name: texts(getattr(data, name).loader.dataset) for name in ("train", "val", "test")} for data in runs]
    plain = hf_data(tmp_path, file)
    pool = sorted(texts(plain.train.loader.dataset) + texts(plain.val.loader.dataset))
    vals = [split["val"] for split in splits]
    assert sorted(text for val in vals for text in val) == pool  # the folds cover the pool, each row in one
    for split, val in zip(splits, vals):
        assert sorted(split["train"] + val) == pool and not set(split["train"]) & set(val)
        assert split["test"] == texts(plain.test.loader.dataset)  # the test rows are the run without folds'
        for word in ("awful", "great"):  # stratified: each class's count a fold within one of a third of the pool's
            assert abs(sum(text.endswith(word) for text in val) - sum(text.endswith(word) for text in pool) / 3) <= 1
    assert runs[0].fingerprint["fold"] == "fold 0 of 3" and runs[0].fingerprint != runs[1].fingerprint

    import datasets

    folder = tmp_path / "own_validation"
    folder.mkdir()
    for split in ("train", "validation"):
        datasets.Dataset.from_list(rows[:30]).to_json(str(folder / f"{split}.jsonl"))
    with pytest.raises(ConfigError, match=r"^data.folds: is 3, but the validation split of .* a val split of its own"):
        hf_data(tmp_path, folder, "data.folds=3", "data.fold=0")


def write_rows(file: Path, rows: list[dict]) -> Path:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("\n".join(json.dumps(row) for row in rows))
    return file


def test_a_row_without_a_text_is_one_line_naming_it_or_skipped_and_counted_and_empty_texts_are_counted(
    tmp_path, caplog
):
    rows = reviews(60, seed=0)
    rows[3]["review"], rows[5]["review"] = None, ""
    file = write_rows(tmp_path / "reviews.jsonl", rows)
    with pytest.raises(ConfigError, match=r"^data.text_column: row 3 \(from 0\) of the train split \('.*reviews.jsonl'"
                       r"\) holds None, not a text; .* data.skip_bad_rows=true"):  # fmt: skip
        hf_data(tmp_path, file)
    with caplog.at_level("INFO"):
        data = hf_data(tmp_path, file, "data.skip_bad_rows=true")
    assert sum(len(getattr(data, split).loader.dataset) for split in ("train", "val", "test")) == 59  # not "None"
    assert "left out 1 of 60 rows whose text is null or not a string (data.skip_bad_rows=true), rows 3" in caplog.text
    assert "1 of 59 texts are empty" in caplog.text


def test_a_plain_minus_one_is_a_class_unless_data_unlabelled_value_names_it(tmp_path, caplog):
    rows = [{"review": ["great", "awful", "meh"][k % 3] * 3, "stars": [1, 0, -1][k % 3]} for k in range(60)]
    file = write_rows(tmp_path / "three.jsonl", rows)
    with caplog.at_level("INFO"):
        assert hf_data(tmp_path, file).class_names == ["-1", "0", "1"]  # -1/0/1 labels: three classes
    assert "3 classes: the values of 'stars' in the training split, sorted: -1, 0, 1" in caplog.text
    with pytest.raises(ConfigError, match=r"^data.label_column: row 2 \(from 0\) of the train split .* is unlabelled "
                       r"\(its 'stars' is -1\), and a training row needs a class"):  # fmt: skip
        hf_data(tmp_path, file, "data.unlabelled_value=-1")
    data = hf_data(tmp_path, file, "data.unlabelled_value=-1", "data.skip_bad_rows=true")
    assert data.class_names == ["0", "1"] and len(data.train.loader.dataset) + len(data.val.loader.dataset) == 36

    folder = tmp_path / "splits"  # unlabelled rows of a test split: left out of its metrics, counted
    write_rows(folder / "train.jsonl", [row for row in rows if row["stars"] >= 0])
    write_rows(folder / "test.jsonl", rows[:9])
    caplog.clear()
    with caplog.at_level("INFO"):
        data = hf_data(tmp_path, folder, "data.unlabelled_value=-1")
    assert len(data.test.loader.dataset) == 6 and "left out 3 of 9 unlabelled rows (null or data.unlabelled_value=-1)" \
        in caplog.text  # fmt: skip


def test_a_classlabel_test_split_without_labels_tests_on_val_and_a_class_only_in_test_is_one_line(tmp_path, caplog):
    import datasets

    features = datasets.Features({"review": datasets.Value("string"), "stars": datasets.ClassLabel(names=["n", "p"])})
    folder = tmp_path / "glue"
    folder.mkdir()
    for split, count in (("train", 40), ("validation", 8), ("test", 6)):  # GLUE's test labels are -1
        rows = [{**row, "stars": -1 if split == "test" else int(row["stars"] == "pos")} for row in reviews(count, 1)]
        datasets.Dataset.from_list(rows, features=features).to_parquet(str(folder / f"{split}.parquet"))
    with caplog.at_level("INFO"):
        data = hf_data(tmp_path, folder)
    assert data.test.dataset is data.val.dataset and len(data.val.dataset) == 8  # the val split, tested
    assert "test.parquet') is unlabelled (all 6 rows), as GLUE's test splits are: the run evaluates on the val" \
        in caplog.text  # fmt: skip

    only_in_test = tmp_path / "only_in_test"
    write_rows(only_in_test / "train.jsonl", reviews(40, seed=0))
    write_rows(only_in_test / "test.jsonl", [*reviews(6, seed=1), {"review": "so-so", "stars": "mid"}])
    with pytest.raises(ConfigError, match=r"^data.label_column: the test split \('.*test.jsonl'\) holds class 'mid' "
                       r"that the training split lacks \(its classes: neg, pos\)"):  # fmt: skip
        hf_data(tmp_path, only_in_test)


def test_a_hub_name_without_the_network_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"^data.path: 'no-such-hub-dataset' is no local file or folder, and the hub "
                       r"could not be reached for it \(HF_HUB_OFFLINE=1 is set\)"):  # fmt: skip
        hf_data(tmp_path, Path("no-such-hub-dataset"))


def test_a_long_text_is_cut_as_its_tokenizer_truncates_keeping_the_closing_special_token(tmp_path):
    """A tokenizer whose post-processor wraps a text in [CLS] ... [SEP]: the run's ids of a long text are those of
    the documented export recipe (truncation=True, max_length=...), [SEP] last, not the first max_length ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "great": 4, "awful": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]").save_pretrained(str(tmp_path / "tok"))
    file = write_rows(tmp_path / "reviews.jsonl", reviews(40, seed=0))
    data = hf_data(tmp_path, file, f"data.tokenizer={tmp_path / 'tok'}", "data.max_length=8")
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    dataset = data.train.loader.dataset
    cut = [dataset[index][0].tolist() for index in range(len(dataset))]
    assert all(ids[0] == 2 and ids[-1] == 3 for ids in cut) and max(map(len, cut)) == 8  # [CLS] ... [SEP], cut inside
    long = next(row["review"] for row in reviews(40, seed=0) if len(row["review"].split()) > 6)
    assert data.tokenizer is not None
    cut, lengths = data.tokenizer.encode_cut([long.encode()], 8)
    assert cut[0].tolist() == exported(long, truncation=True, max_length=8)["input_ids"] == [2, *[4 if "great" in
           long else 5] * 6, 3] and lengths == [len(long.split()) + 2]  # fmt: skip


def test_a_resume_under_another_tokenizer_says_the_splits_are_the_same_and_the_tokens_differ(tmp_path):
    from trainkit.data.fingerprint import check_same_data

    file = write_rows(tmp_path / "reviews.jsonl", reviews(40, seed=0))
    trained = hf_data(tmp_path, file, "data.tokenizer=bpe", "data.vocab_size=300", run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^data: the tokenizer is bytes, was bpe sha256:\w+ since the checkpoint: "
                       r"the splits are the same, but the resumed run would read them as other tokens"):  # fmt: skip
        check_same_data(trained.fingerprint, hf_data(tmp_path, file).fingerprint)
