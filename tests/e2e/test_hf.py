"""model=hf end to end: a transformers model from a config trains a text classifier and a language model on the loop;
a model saved with save_pretrained to a folder (made here: nothing is downloaded) fine-tunes from it; eval.py gives
summary.json's test metrics and exports a folder from_pretrained loads with the same logits; bf16, micro-batches,
gradient checkpointing run on it (EMA and the finders: their own test files); a SIGTERM inside an epoch resumes exactly;
DDP runs it in 2 processes (FSDP: test_fsdp_runs.py); a config that cannot work is one line before the run directory."""

import json
import os
from pathlib import Path

import pytest
import torch
from test_text_classification import PATTERNS, write_texts

from conftest import ROOT, run_here
from helpers import assert_same_training

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

    from trainkit.data.tokenizing import train_bpe

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
    model, _ = build_model(best["config"]["model"], {}, image_size=None)
    model.load_state_dict(best["model"])
    tokens = torch.tensor([[98, 99, 100, 33, 0, 0], [50, 51, 52, 33, 50, 51]])  # 'abc ' padded; '123 12'
    with torch.no_grad():
        logits = loaded(input_ids=tokens, attention_mask=(tokens != 0).long()).logits
        torch.testing.assert_close(logits, model.eval()(tokens))
    assert [loaded.config.id2label[int(label)] for label in logits.argmax(1)] == ["letters", "digits"]


def test_a_saved_model_fine_tunes_from_its_folder_and_predicts(run_train, corpus, saved_model, tmp_path):
    run = run_train(*texts(corpus, f"model.path={saved_model}"))
    assert run.summary["test"]["test/acc"] > 0.9  # its 2-class head rebuilt for the 3 classes
    unseen = write_texts(tmp_path / "unseen", 2, seed=5)  # texts it never saw, a folder a class
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
    # (EMA and the finders on it: test_ema_runs.py, test_lr_finder_runs.py, test_batch_size_finder_runs.py)
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
    assert not run.run_dir.exists()


@pytest.mark.slow  # three subprocess runs
def test_stopped_by_sigterm_inside_an_epoch_it_resumes_exactly(run_train, corpus, handed_over, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    folder = (f"model.path={handed_over}", f"data.tokenizer={handed_over}")  # a saved model and its tokenizer
    preempting = texts(corpus, *folder, "model._target_=models_for_tests.preempted_hf_model",
                       "trainer.log_every_n_steps=1", "regularization.early_stopping.enabled=false")  # fmt: skip
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
    """`distributed` (distributed=ddp here, =fsdp in test_fsdp_runs.py) in 2 processes: trained, and tested by eval.py
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
    model, _ = build_model(best["config"]["model"], {}, image_size=None)
    model.load_state_dict(best["model"])
    with torch.no_grad():
        logits = loaded(**encoded).logits
        torch.testing.assert_close(logits, model.eval()(encoded["input_ids"]))
    assert sorted(loaded.config.id2label.values())[:2] == ["asyncio", "distutils"]  # the packages, as classes
