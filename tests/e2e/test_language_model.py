"""experiment=stdlib_gpt end to end, on a tiny GPT and a small corpus: train.py trains it, eval.py gives the test
bits per byte of summary.json and samples a prompt's continuation, seeded; an update's loss is the mean over its
tokens however they fall into accumulated batches and ranks; resume and DDP agree (FSDP: test_fsdp_runs.py)."""

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, composed, run_here
from helpers import assert_same_training, has_predict, needs_predict, nothing_left, spawn_ranks, template_has
from trainkit.checkpointing import save_checkpoint
from trainkit.config import to_dict
from trainkit.data import DataBundle
from trainkit.data.stdlib_source import stdlib_files
from trainkit.distributed.parallel import DDP
from trainkit.distributed.process_group import ProcessInfo
from trainkit.models import build_model
from trainkit.models.gpt import GPT
from trainkit.tasks.language_model import LanguageModel
from trainkit.tracking.loggers import Loggers

sys.path.insert(0, str(ROOT))
import train

TINY = (
    "experiment=stdlib_gpt",
    "data.block_size=32",
    "data.batch_size=8",
    "data.eval_batch_size=64",
    "data.val_fraction=0.2",
    "data.test_fraction=0.2",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=6",
    "trainer.limit_val_batches=2",
    "trainer.progress_bar=false",
    "print_config=false",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return stdlib_corpus(tmp_path_factory.mktemp("corpus"))


def stdlib_corpus(folder: Path) -> Path:
    """Twenty files of the standard library, copied into `folder`: a corpus of ~0.3 MB."""
    for k, path in enumerate(stdlib_files()[:20]):
        (folder / f"{k:02d}_{path.name}").write_bytes(path.read_bytes())
    return folder


def tiny(corpus: Path, *overrides: str) -> tuple[str, ...]:
    return (*TINY, f"data.root={corpus}", *overrides)


def test_a_run_tests_in_bits_per_byte_and_eval_py_gives_the_same_and_samples_a_prompt(run_train, corpus, tmp_path):
    run = run_train(*tiny(corpus))
    assert run.summary["optimized_metric"] == "val/bpb"
    epochs = run.epoch_metrics()
    assert epochs[-1]["train/tokens_per_sec"] > 0 and epochs[-1]["train/padding_fraction"] == 0
    assert epochs[-1]["val/bpb"] == pytest.approx(epochs[-1]["val/loss"] / 0.6931471805599453)
    assert epochs[-1]["val/bpb"] < 8  # learning: ln(256) nats is 8 bits

    code, _, stderr = run_here("eval.py", f"hydra.run.dir={tmp_path / 'eval'}", f"checkpoint={run.run_dir}")
    assert code == 0, stderr[-3000:]
    import json

    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {key: metrics[key] for key in run.summary["test"]} == pytest.approx(run.summary["test"], rel=1e-6)

    def sample(name: str, *overrides: str) -> str:
        out = tmp_path / name
        code, stdout, stderr = run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run.run_dir}", *overrides)
        assert code == 0, stderr[-3000:]
        text = (out / "samples.txt").read_text(encoding="utf-8")
        assert text in stdout
        return text

    prompt = "def fibonacci(n):"
    first = sample("s1", f"prompt='{prompt}'", "sample.max_new_tokens=40")
    assert first.startswith(prompt) and len(first.encode()) >= len(prompt) + 20  # 40 bytes, some may decode as one
    assert sample("s2", f"prompt='{prompt}'", "sample.max_new_tokens=40") == first
    assert sample("s3", f"prompt='{prompt}'", "sample.max_new_tokens=40", "sample.seed=1") != first
    if has_predict:  # a text file's text continued
        prompt_file = tmp_path / "prompt.txt"
        prompt_file.write_text("import os\n")
        assert sample("s4", f"predict={prompt_file}", "sample.max_new_tokens=10").startswith("import os\n")


@pytest.fixture(scope="module")
def untrained_gpt(corpus, tmp_path_factory) -> Path:
    """A run directory as train.py leaves it (.hydra/overrides.yaml, checkpoints/last.pt), its tiny GPT untrained."""
    run_dir = tmp_path_factory.mktemp("untrained_gpt") / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(list(tiny(corpus))), run_dir / ".hydra" / "overrides.yaml")
    config = to_dict(composed(*tiny(corpus), "data.vocabulary=256"))  # train.py fills in the tokenizer's ids
    model = build_model(config["model"])
    state = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 0, "batches_done": 0}
    save_checkpoint(run_dir / "checkpoints" / "last.pt", {**state, "config": config})
    return run_dir


def evaluate(run_dir: Path, out: Path, *overrides: str) -> tuple[int, str, str]:
    return run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", *overrides)


@needs_predict
def test_predict_is_a_text_file_to_continue_and_a_path_that_is_not_one_is_refused(untrained_gpt, tmp_path):
    (tmp_path / "prompt.txt").write_text("import os\n")
    code, _, stderr = evaluate(untrained_gpt, tmp_path / "file", f"predict={tmp_path / 'prompt.txt'}",
                                    "sample.max_new_tokens=5")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert (tmp_path / "file" / "samples.txt").read_text().startswith("import os\n")  # the file's text, continued
    for given, what in ((tmp_path / "nope.txt", "does not exist"), (tmp_path, "is a folder")):
        code, _, stderr = evaluate(untrained_gpt, tmp_path / "out", f"predict={given}")
        lines = stderr.strip().splitlines()
        assert code == 1 and lines == [
            f"error: predict: '{given}' {what}; a language model continues a text file (predict=<file>) or "
            "prompt='<text>'"
        ], stderr
        assert nothing_left(tmp_path / "out")  # nothing sampled, no output directory
    code, _, stderr = evaluate(untrained_gpt, tmp_path / "both", "prompt=x", f"predict={tmp_path / 'prompt.txt'}")
    assert code == 1 and stderr.strip().startswith("error: prompt: ") and len(stderr.strip().splitlines()) == 1


BAD_SAMPLE_OPTIONS = ["sample.max_new_tokens=abc", "sample.max_new_tokens=-1", "sample.temperature=-1",
                      "sample.top_k=0", "sample.seed=-3", "sample.seed=1.5"]  # fmt: skip


@pytest.mark.parametrize("override", BAD_SAMPLE_OPTIONS)
def test_a_bad_sample_option_is_one_line_naming_it(untrained_gpt, tmp_path, override):
    code, _, stderr = evaluate(untrained_gpt, tmp_path / "out", "prompt=import", override)
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {override.split('=')[0]}: "), stderr
    assert nothing_left(tmp_path / "out")


def test_sample_seed_null_draws_a_seed_prints_it_and_that_seed_gives_the_same_sample(untrained_gpt, tmp_path):
    code, stdout, stderr = evaluate(untrained_gpt, tmp_path / "drawn", "prompt=import", "sample.seed=null",
                                    "sample.max_new_tokens=30")  # fmt: skip
    assert code == 0, stderr[-3000:]
    seed = int(re.search(r"sample\.seed=(\d+) drawn: pass it to sample the same again", stdout).group(1))
    assert OmegaConf.load(tmp_path / "drawn" / ".hydra" / "config.yaml").sample.seed == seed  # what was sampled with
    code, _, stderr = evaluate(untrained_gpt, tmp_path / "again", "prompt=import", f"sample.seed={seed}",
                               "sample.max_new_tokens=30")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert (tmp_path / "again" / "samples.txt").read_text() == (tmp_path / "drawn" / "samples.txt").read_text()


@pytest.mark.skipif(not template_has("logger.log_predictions"), reason="this clone has no logged_images (trimmed)")
def test_the_trackers_get_a_text_sample_after_each_validation(run_train, corpus, monkeypatch):
    """What logger.log_predictions (on by default in every tracker that shows predictions: test_loggers) sends
    every tracker, seen without one; each tracker's own test reads the text back from its files."""
    sent = []
    monkeypatch.setattr(Loggers, "log_text", lambda self, *arguments: sent.append(arguments))
    run_train(*tiny(corpus, "logger.log_predictions=4", "task.sample_tokens=20"))
    assert [(key, step) for key, _, step in sent] == [("val/sample", 6), ("val/sample", 12)]
    assert all(len(text.encode()) >= 20 for _, text, _ in sent)  # a prompt and its 20 sampled bytes


def test_image_augmentation_and_flips_are_refused_on_text_in_one_line(run_train, corpus):
    refused = run_train(*tiny(corpus, "augmentation=shift"), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("error: augmentation: ")


@pytest.mark.parametrize(
    "switch",
    [
        ("precision=bf16",),
        ("trainer.accumulate_grad_batches=2",),
    ],
    ids=["bf16", "accumulation"],  # EMA, the LR finder, micro_batch_size=auto: their own tests/e2e/test_*_runs.py
)
def test_the_templates_switches_train_a_language_model(run_train, corpus, switch):
    run = run_train(*tiny(corpus, *switch))
    assert run.summary["test"]["test/bpb"] < 8  # learning: ln(256) nats is 8 bits


# ---- the per-token weighting, through train.py's own loop --------------------------------------


def lm_batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four batches of 16-byte blocks, their targets partly ignored (-100) so that batches weigh unevenly."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for rows, ignored in [(2, 10), (3, 0), (1, 15), (2, 4)]:
        inputs = torch.randint(0, 256, (rows, 16), generator=generator)
        targets = torch.randint(0, 256, (rows, 16), generator=generator)
        targets[0, 16 - ignored :] = -100
        out.append((inputs, targets))
    return out


def lm_run(batches, accumulate: int, micro_batch_size: int | None = None) -> train.Run:
    trainer = {"accumulate_grad_batches": accumulate, "micro_batch_size": micro_batch_size, "grad_clip": None,
               "limit_train_batches": None, "max_steps": None, "log_every_n_steps": 1000,
               "checkpoint_every_n_steps": None}  # fmt: skip
    cfg = OmegaConf.create({"trainer": trainer, "precision": {"name": "fp32"}})
    run = train.Run(cfg, Path("unused"), ProcessInfo(), torch.device("cpu"))
    run.data = DataBundle(batches, batches, batches, num_classes=256, kind="tokens", pad_id=None)
    torch.manual_seed(0)
    run.model = run.trained_model = GPT(block_size=16, n_layer=1, n_head=2, n_embd=16)
    run.train_transform = run.eval_transform = torch.nn.Identity()
    run.task = LanguageModel()
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=1.0)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    return run


def weights_after_one_update(batches, accumulate: int, micro_batch_size: int | None = None) -> torch.Tensor:
    run = lm_run(batches, accumulate, micro_batch_size)
    train.train_one_epoch(run, show_progress=False)
    assert run.state.step == 1
    return torch.cat([p.detach().flatten() for p in run.model.parameters()])


def one_batch(batches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.cat([i for i, _ in batches]), torch.cat([t for _, t in batches]))]


def test_accumulated_and_micro_batches_of_a_language_model_update_as_one_batch():
    batches = lm_batches()
    whole = weights_after_one_update(one_batch(batches), accumulate=1)
    torch.testing.assert_close(weights_after_one_update(batches, accumulate=4), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights_after_one_update(one_batch(batches), 1, 32), whole, rtol=0, atol=1e-6)


def _two_rank_update(rank: int, world_size: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        run = lm_run(lm_batches()[rank::2], accumulate=2)
        run.proc = ProcessInfo(rank=rank, world_size=world_size)
        run.parallel = DDP("fp32", rank == 0, torch.device("cpu"))
        run.trained_model = run.parallel.wrap(run.model)
        train.train_one_epoch(run, show_progress=False)
        if rank == 0:
            torch.save(torch.cat([p.detach().flatten() for p in run.model.parameters()]), out)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two processes
def test_two_ranks_of_a_language_model_update_as_one_batch(tmp_path):
    out = tmp_path / "weights.pt"
    spawn_ranks(_two_rank_update, 2, str(tmp_path / "init"), str(out))
    whole = weights_after_one_update(one_batch(lm_batches()), accumulate=1)
    torch.testing.assert_close(torch.load(out), whole, rtol=0, atol=1e-6)


# ---- resume ----------------------------------------------------------------------------------


@pytest.mark.slow  # three subprocess runs
def test_a_language_model_stopped_by_sigterm_inside_an_epoch_resumes_exactly(run_train, corpus, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    preempting = tiny(corpus, "model._target_=gpt_for_tests.PreemptedGPT", "trainer.log_every_n_steps=1",
                      "regularization.early_stopping.enabled=false")  # fmt: skip
    straight = run_train(*preempting, "+model.preempt_at=0", isolated=True)
    preempted = run_train(*preempting, "+model.preempt_at=9", isolated=True, check=False)
    assert preempted.returncode == 75, preempted.stderr[-3000:]
    resumed = run_train("resume=auto", *preempting, "+model.preempt_at=0", run_dir=preempted.run_dir, isolated=True)
    assert "at epoch 1, batch 3, step 9" in resumed.stdout + resumed.stderr
    assert_same_training(resumed, straight)


# The language model under the features (each skips once a trim took the feature away).


@pytest.mark.skipif(not template_has("regularization.ema"), reason="this clone has no EMA (trimmed)")
def test_a_language_model_trains_with_ema(run_train, corpus):
    run = run_train(*tiny(corpus, "regularization.ema.enabled=true", "regularization.ema.decay=0.9"))
    assert run.summary["test"]["test/bpb"] < 8  # learning: ln(256) nats is 8 bits
    assert torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)["averaged"] is not None


@pytest.mark.skipif(not template_has("lr_finder"), reason="this clone has no LR finder (trimmed)")
def test_the_lr_finder_runs_before_a_language_model_trains(run_train, corpus):
    run = run_train(*tiny(corpus, "lr_finder.enabled=true", "lr_finder.num_steps=12", "lr_finder.apply=true"))
    assert run.summary["test"]["test/bpb"] < 8  # learning: ln(256) nats is 8 bits
    log = (run.run_dir / "train.log").read_text()
    assert (run.run_dir / "lr_finder.png").is_file() and "suggest" in log


@pytest.mark.slow  # two 2-process runs
@pytest.mark.skipif(not template_has("distributed/fsdp.yaml"), reason="this clone has no FSDP (trimmed)")
def test_fsdp_with_a_shard_unit_a_block_trains_as_ddp_does(run_train, corpus):
    two = ("distributed.nproc_per_node=2", "regularization.early_stopping.enabled=false")
    ddp = run_train(*tiny(corpus, "distributed=ddp", *two))
    fsdp = run_train(*tiny(corpus, "distributed=fsdp", "distributed.blocks=[Block]", *two))
    assert ddp.summary["world_size"] == fsdp.summary["world_size"] == 2
    for key in ("val/loss", "val/bpb", "lr", "step"):
        assert fsdp.epoch_metrics()[-1][key] == pytest.approx(ddp.epoch_metrics()[-1][key], rel=1e-5), key
    assert fsdp.summary["test"] == pytest.approx(ddp.summary["test"], rel=1e-5)
