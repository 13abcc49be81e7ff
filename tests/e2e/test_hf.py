"""model=hf end to end: a transformers model from a config trains a text classifier and a language model on the loop;
a model saved with save_pretrained to a folder (made here: nothing is downloaded) fine-tunes from it; eval.py gives
summary.json's test metrics and exports a folder from_pretrained loads with the same logits; bf16, micro-batches,
gradient checkpointing run on it; a SIGTERM inside an epoch resumes exactly; DDP runs it in 2 processes; a config
that cannot work is one line before the run directory. EMA, the finders and FSDP on it where the clone has them."""

import json
import os
import random
import re
from pathlib import Path

import pytest
import torch
from test_text_classification import PATTERNS, TINY, predicted_classes, tiny, write_texts

from conftest import ROOT, run_here
from helpers import assert_same_training, has_predict, nothing_left, template_has

BERT = "{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64, "
TINY_BERT = f"model.config={BERT}max_position_embeddings: 64}}"
TEXTS = (
    "experiment=stdlib_functions",  # AdamW, a token budget
    "data=textfolder",
    "data.num_workers=0",
    "data.max_length=64",
    "data.max_tokens=256",
    "data.batch_size=16",
    "data.val_fraction=0.2",
    "data.test_fraction=0.2",
    "model=hf",
    "optimizer.lr=3e-3",
    "trainer.max_epochs=2",
    "trainer.progress_bar=false",
    "print_config=false",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """train/<class>/*.txt, 45 files a class of three byte patterns; val/ and test/ are carved from it."""
    return write_texts(tmp_path_factory.mktemp("texts") / "train", 45, seed=0).parent


def texts(corpus: Path, *overrides: str) -> tuple[str, ...]:
    return (*TEXTS, f"data.root={corpus}", *overrides)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """A "pretrained" model: a tiny BERT with a 2-class head, saved with save_pretrained (the data has 3 classes)."""
    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("pretrained") / "bert"
    torch.manual_seed(1)
    config = BertConfig(vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, pad_token_id=0)  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def handed_over(tmp_path_factory) -> Path:
    """A "pretrained" model and its tokenizer in one folder, as save_pretrained writes them: a BPE learned here, a
    tiny BERT of its vocabulary with a 2-class head (the data has 3 classes)."""
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    from trainkit.data.tokenizer_library import train_bpe

    folder = tmp_path_factory.mktemp("handed_over") / "bert"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_bpe(400, [p * 40 for p in PATTERNS.values()]),
                                        pad_token="<pad>")  # fmt: skip
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(1)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def evaluated(run_dir: Path, out: Path, *overrides: str) -> dict:
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", *overrides)
    assert code == 0, stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


def test_a_classifier_from_a_config_trains_and_its_export_loads_back_with_the_same_logits(run_train, corpus, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainkit.checkpointing import load_checkpoint
    from trainkit.models import build_model

    run = run_train(*texts(corpus, TINY_BERT))
    assert run.summary["test"]["test/acc"] > 0.9  # the majority class is a third
    metrics = evaluated(run.run_dir, tmp_path / "eval")
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)

    code, stdout, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run.run_dir}",
                                    f"export={tmp_path / 'export'}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert "exported the run's tokenizer (data.tokenizer=bytes: byte b is id b + 1, 0 pads)" in stdout
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    exported = AutoTokenizer.from_pretrained(tmp_path / "export", local_files_only=True)
    ids = exported(["abc ", "123 12"], padding=True)["input_ids"]
    assert ids == [[98, 99, 100, 33, 0, 0], [50, 51, 52, 33, 50, 51]]  # the ids the run trained on (tokens below)
    assert loaded.config.id2label == dict(enumerate(sorted(PATTERNS)))  # the class folders' names
    best = load_checkpoint(run.run_dir / "checkpoints" / "best.pt", torch.device("cpu"))
    model = build_model(best["config"]["model"])
    model.load_state_dict(best["model"])
    tokens = torch.tensor([[98, 99, 100, 33, 0, 0], [50, 51, 52, 33, 50, 51]])  # 'abc ' padded; '123 12'
    with torch.no_grad():
        logits = loaded(input_ids=tokens, attention_mask=(tokens != 0).long()).logits
        torch.testing.assert_close(logits, model.eval()(tokens))
    assert [loaded.config.id2label[int(label)] for label in logits.argmax(1)] == ["letters", "digits"]


def test_a_saved_model_fine_tunes_from_its_folder_and_predicts(run_train, corpus, saved_model, tmp_path):
    run = run_train(*texts(corpus, f"model.path={saved_model}"))
    assert run.summary["test"]["test/acc"] > 0.9  # its 2-class head rebuilt for the 3 classes
    if not has_predict:
        return
    unseen = write_texts(tmp_path / "unseen", 2, seed=5)  # texts it never saw, a folder per class
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'out'}", f"checkpoint={run.run_dir}",
                               f"predict={unseen}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    rows = (tmp_path / "out" / "predictions.csv").read_text().splitlines()[1:]
    predicted = {row.split(",")[0]: row.split(",")[1] for row in rows}
    assert predicted == {f"{name}/{number:02}.txt": name for name in PATTERNS for number in range(2)}


def test_a_saved_model_and_its_tokenizer_fine_tune_from_one_folder(run_train, corpus, handed_over, tmp_path):
    """What a colleague hands over: save_pretrained's model and tokenizer in one folder, named by model.path and
    data.tokenizer alike; eval.py gives summary.json's test metrics and exports both again."""
    from transformers import AutoTokenizer

    folder = handed_over
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    run = run_train(*texts(corpus, f"model.path={folder}", f"data.tokenizer={folder}"))
    assert run.summary["test"]["test/acc"] > 0.9
    metrics = evaluated(run.run_dir, tmp_path / "eval")
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run.run_dir}",
                               f"export={tmp_path / 'export'}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "export"), local_files_only=True)
    assert exported("abc 123")["input_ids"] == tokenizer("abc 123")["input_ids"]


def test_a_language_model_from_a_config_trains_samples_and_exports(run_train, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainkit.models.hf import create_hf_model

    root = tmp_path / "prose"
    root.mkdir()
    for number in range(10):
        (root / f"{number}.txt").write_text(f"the cat {number} sat on the mat. " * 40)
    gpt2 = "{model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 2, n_positions: 32, bos_token_id: null, "
    gpt2 += "eos_token_id: null}"  # GPT-2's 50256 is no byte
    run = run_train("experiment=stdlib_gpt", f"data.root={root}", "data.pattern=*.txt", "data.block_size=32",
                    "data.val_fraction=0.1", "data.test_fraction=0.1", "model=hf", f"model.config={gpt2}",
                    "trainer.max_epochs=2", "trainer.limit_train_batches=10", "trainer.limit_val_batches=2",
                    "trainer.progress_bar=false", "print_config=false")  # fmt: skip
    epochs = run.epoch_metrics()
    assert epochs[-1]["val/bpb"] < epochs[0]["val/bpb"] < 8  # below a uniform guess over the 256 bytes, and falling
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'sample'}", f"checkpoint={run.run_dir}",
                                    "prompt='the cat'", "sample.max_new_tokens=40")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert (tmp_path / "sample" / "samples.txt").read_text().startswith("the cat")  # the context cropped to 32
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run.run_dir}",
                               f"export={tmp_path / 'export'}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    ours = create_hf_model("trainkit.tasks.language_model.LanguageModel", 256, path=str(tmp_path / "export")).eval()
    tokens = torch.tensor([list(b"the cat 3 sat")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=tokens).logits, ours(tokens))


def test_the_loops_features_run_on_it(run_train, corpus):
    overrides = ["precision=bf16", "trainer.micro_batch_size=64", "model.gradient_checkpointing=true"]
    run = run_train(*texts(corpus, TINY_BERT, "trainer.max_epochs=1", *overrides))
    assert "in micro-batches of 64" in run.stdout + run.stderr and run.summary["test_weights"] == "best"
    model = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert all(value.dtype == torch.float32 for value in model.values() if value.is_floating_point())  # bf16: autocast


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ([], "error: model.path: and model.config: neither is set; give one: model.path=<a folder saved with "),
        ([TINY_BERT, "model.path=/somewhere"], "error: model.path: and model.config: both are set; give one"),
        ([f"model.config={BERT}max_position_embeddings: 32}}"],
         "error: model.config.max_position_embeddings: is 32, below data.max_length=64: the model has no position"),
        ([f"model.config={BERT}vocab_size: 300}}"],
         "error: model.config.vocab_size: is set apart from the architecture: drop it and set model.vocab_size"),
        (["model.path=/no/such/folder"], "error: model.path: '/no/such/folder' does not exist; give a folder"),
        (["model.config={hidden_size: 32}"], "error: model.config: must be a mapping with a model_type (a config"),
    ],
    ids=["neither", "both", "positions", "vocab_size", "no_folder", "no_model_type"],
)  # fmt: skip
def test_a_config_that_cannot_work_is_one_line_before_the_run_directory(run_train, corpus, overrides, error):
    run = run_train(*texts(corpus, *overrides), check=False)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith(error), run.stderr[-3000:]
    assert nothing_left(run.run_dir)


@pytest.mark.slow  # three subprocess runs
def test_stopped_by_sigterm_inside_an_epoch_it_resumes_exactly(run_train, corpus, handed_over, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    folder = (f"model.path={handed_over}", f"data.tokenizer={handed_over}")  # a saved model and its tokenizer
    preempting = texts(corpus, *folder, "model._target_=models_for_tests.preempted_model",
                       "+model.builds=trainkit.models.hf.create_hf_model", "trainer.log_every_n_steps=1",
                       "regularization.early_stopping.enabled=false")  # fmt: skip
    straight = run_train(*preempting, "+model.preempt_at=0", isolated=True)
    per_epoch = straight.epoch_metrics()[0]["step"]
    preempted = run_train(*preempting, f"+model.preempt_at={per_epoch + 3}", isolated=True, check=False)
    assert preempted.returncode == 75, preempted.stderr[-3000:]
    resumed = run_train("resume=auto", *preempting, "+model.preempt_at=0", run_dir=preempted.run_dir, isolated=True)
    assert f"at epoch 1, batch 3, step {per_epoch + 3}" in resumed.stdout + resumed.stderr
    assert_same_training(resumed, straight)  # dropout's random streams too: BERT's hidden_dropout_prob is 0.1


@pytest.mark.slow  # a 2-process run and its evaluation
def test_two_processes_train_it_and_test_as_one_process_does(run_train, corpus, handed_over, tmp_path):
    trains_in_two_processes_and_tests_as_one(run_train, corpus, handed_over, tmp_path, "distributed=ddp")


def trains_in_two_processes_and_tests_as_one(run_train, corpus: Path, handed_over: Path, tmp_path, distributed: str):
    """`distributed` (distributed=ddp or =fsdp) in 2 processes: trained, and tested by eval.py
    in one process to the test metrics the run wrote."""
    two = (distributed, "distributed.nproc_per_node=2", "regularization.early_stopping.enabled=false")
    run = run_train(*texts(corpus, f"model.path={handed_over}", f"data.tokenizer={handed_over}", *two))
    assert run.summary["world_size"] == 2 and run.summary["test"]["test/acc"] > 0.9
    metrics = evaluated(run.run_dir / "checkpoints" / "best.pt", tmp_path / "eval")
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)


def test_the_stdlib_functions_hf_experiment_trains_and_exports_its_bpe_with_the_model(run_train, tmp_path):
    """experiment=stdlib_functions_hf, its sizes cut down to a few updates; its export: the BPE the run learned and
    the BERT, which AutoTokenizer and AutoModelForSequenceClassification load back (offline) to the run's logits."""
    import inspect

    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainkit.checkpointing import load_checkpoint
    from trainkit.models import build_model

    run = run_train("experiment=stdlib_functions_hf", "data.vocab_size=400", "data.max_length=64",
                    "data.max_tokens=1024", "model.config.hidden_size=32", "model.config.intermediate_size=64",
                    "model.config.max_position_embeddings=64", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
                    "trainer.limit_val_batches=2", "trainer.progress_bar=false", "print_config=false")  # fmt: skip
    assert run.summary["steps"] == 4 and run.summary["epochs"] == 1  # trainer.limit_train_batches=4: four updates
    best = load_checkpoint(run.run_dir / "checkpoints" / "best.pt", torch.device("cpu"))
    assert best["config"]["model"]["config"]["model_type"] == "bert"
    assert best["config"]["model"]["vocab_size"] == 400  # the BPE's ids, the bytes' 257 no more
    code, stdout, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run.run_dir}",
                                    f"export={tmp_path / 'export'}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert "exported the run's tokenizer (data.tokenizer=bpe)" in stdout

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export", local_files_only=True)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    texts = [inspect.getsource(json.dumps), "def f(x):\n    return x"]
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    trained = Tokenizer.from_file(str(run.run_dir / "tokenizer" / "tokenizer.json"))  # as the data encoded them
    assert encoded["input_ids"][1][: encoded["attention_mask"][1].sum()].tolist() == trained.encode(texts[1]).ids
    assert encoded["input_ids"][1][-1] == tokenizer.pad_token_id == best["config"]["model"]["pad_token_id"] == 0
    model = build_model(best["config"]["model"])
    model.load_state_dict(best["model"])
    with torch.no_grad():
        logits = loaded(**encoded).logits
        torch.testing.assert_close(logits, model.eval()(encoded["input_ids"]))
    assert sorted(loaded.config.id2label.values())[:2] == ["asyncio", "distutils"]  # the packages, as classes


# ---- data.tokenizer=bpe, a tokenizer folder, data=hf ----


def eval_py_gives_the_summarys_test(run, out: Path) -> None:
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run.run_dir}")
    assert code == 0, stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("test/acc", "test/loss"):
        assert metrics[key] == pytest.approx(run.summary["test"][key], rel=1e-6), key


def test_a_bpe_is_learned_once_and_reused_by_a_resume_eval_py_and_predict(run_train, corpus, tmp_path):
    bpe = ("data.tokenizer=bpe", "data.vocab_size=300", "data.max_length=24", "data.max_tokens=96")
    first = run_train(*tiny(corpus, *bpe, "trainer.max_epochs=1"))
    saved = first.run_dir / "tokenizer" / "tokenizer.json"
    assert "ids learned from the training split" in first.stdout + first.stderr and saved.is_file()
    learned = saved.read_bytes()
    resumed = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir)
    assert f"{saved} (saved by the run)" in resumed.stdout + resumed.stderr and saved.read_bytes() == learned
    assert resumed.summary["test"]["test/acc"] > 0.9
    eval_py_gives_the_summarys_test(resumed, tmp_path / "eval")
    if has_predict:
        assert predicted_classes(first, tmp_path) == {f"{name}.txt": name for name in PATTERNS}


def test_a_local_tokenizer_folder_trains_and_eval_py_tests_the_same(run_train, corpus, tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from trainkit.data.tokenizer_library import train_bpe

    folder = tmp_path / "tokenizer"
    tokenizer = train_bpe(400, [pattern * 40 for pattern in PATTERNS.values()])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>").save_pretrained(str(folder))
    run = run_train(*tiny(corpus, f"data.tokenizer={folder}", "trainer.max_epochs=3"))
    assert run.summary["test"]["test/acc"] > 0.9
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["config"]["data"]["vocabulary"] == len(AutoTokenizer.from_pretrained(str(folder)))
    assert checkpoint["config"]["model"]["pad_id"] == tokenizer.token_to_id("<pad>")
    eval_py_gives_the_summarys_test(run, tmp_path / "eval")
    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run.run_dir}",
                               f"export={tmp_path / 'export'}")  # fmt: skip
    assert code == 0, stderr[-3000:]  # the folder's tokenizer goes with the weights, as AutoTokenizer reads it
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "export"), local_files_only=True)
    assert exported("abc 123")["input_ids"] == tokenizer.encode("abc 123").ids and exported.pad_token == "<pad>"


def test_data_hf_trains_on_a_jsonl_file_in_workers_by_a_token_budget(run_train, tmp_path):
    rows = [{"body": (pattern * 30)[: random.Random(k).randint(3, 60)], "kind": name}
            for k in range(40) for name, pattern in PATTERNS.items()]  # fmt: skip
    file = tmp_path / "texts.jsonl"
    file.write_text("\n".join(json.dumps(row) for row in rows))
    hf = ("data=hf", f"data.path={file}", "data.text_column=body", "data.label_column=kind",
          f"data.cache_dir={tmp_path / 'cache'}", "data.num_workers=1", "data.max_length=64")  # fmt: skip
    recipe = [override for override in TINY if override not in ("data=textfolder", "data.num_workers=0")]
    run = run_train(*recipe, *hf)
    assert run.summary["test"]["test/acc"] > 0.9
    eval_py_gives_the_summarys_test(run, tmp_path / "eval")


# ---- other capabilities on it, where this clone has them ----


@pytest.mark.skipif(not template_has("regularization.ema"), reason="this clone has no EMA (trimmed)")
def test_a_hugging_face_model_trains_with_ema_in_bf16_micro_batches_checkpointing(run_train, corpus):
    overrides = ["precision=bf16", "trainer.micro_batch_size=64", "model.gradient_checkpointing=true",
                 "regularization.ema.enabled=true"]  # fmt: skip
    run = run_train(*texts(corpus, TINY_BERT, "trainer.max_epochs=1", *overrides))
    best = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)
    averaged, model = best["averaged"], best["model"]
    assert averaged is not None and run.summary["test_weights"] == "best"
    average = {name.removeprefix("module."): value for name, value in averaged.items() if name != "n_averaged"}
    assert average.keys() == model.keys() and averaged["n_averaged"] > 0  # every update taken in
    moved = [name for name in model if model[name].is_floating_point() and not torch.equal(model[name], average[name])]
    assert moved  # the average lags the trained weights: EMA changed what is kept (and tested)


@pytest.mark.skipif(not template_has("lr_finder"), reason="this clone has no LR finder (trimmed)")
def test_the_lr_finder_runs_on_a_hugging_face_model(run_train, corpus):
    overrides = ["lr_finder.enabled=true", "lr_finder.num_steps=6"]
    run = run_train(*texts(corpus, TINY_BERT, "trainer.max_epochs=1", *overrides))
    said = run.stdout + run.stderr
    assert "lr range test: 6 steps from" in said or "lr range test: stopped by" in said  # the finder ran its steps
    assert (run.run_dir / "lr_finder.png").is_file() and run.summary["test_weights"] == "best"


@pytest.mark.skipif(not template_has("batch_size_finder"), reason="this clone has no batch-size finder (trimmed)")
def test_the_batch_size_finder_runs_on_a_hugging_face_model(run_train, corpus):
    overrides = ["batch_size_finder.enabled=true", "batch_size_finder.max_batch_size=16", "data.max_tokens=null"]
    run = run_train(*texts(corpus, TINY_BERT, "trainer.max_epochs=1", *overrides))  # max_tokens: fixed batches
    found = re.search(r"batch size finder: data\.batch_size=(\d+) per process", run.stdout + run.stderr)
    assert found and 1 <= int(found[1]) <= 16  # searched, within batch_size_finder.max_batch_size
    config = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)["config"]
    assert config["data"]["batch_size"] == int(found[1])  # what every checkpoint holds: the size it trained with


@pytest.mark.slow  # a 2-process run and its evaluation
@pytest.mark.skipif(not template_has("distributed/fsdp.yaml"), reason="this clone has no FSDP (trimmed)")
def test_a_hugging_face_model_in_two_fsdp_processes_tests_as_one_process_does(run_train, corpus, handed_over, tmp_path):
    trains_in_two_processes_and_tests_as_one(run_train, corpus, handed_over, tmp_path, "distributed=fsdp")
