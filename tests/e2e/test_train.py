"""End to end: train.py as `python train.py` runs it, judged by its run directory: in this process (run_train),
or in a subprocess where the process itself is the point (a kill, DDP)."""

import re
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT
from helpers import assert_same_training, has_loop_timing, needs_image_folders

QUICK = ("trainer.max_epochs=3", "trainer.progress_bar=false")


def test_default_run_learns_and_writes_the_run_directory(run_train):
    run = run_train(*QUICK)
    summary, epochs = run.summary, run.epoch_metrics()
    # 3 epochs on digits reach about 0.98 val/test accuracy (chance is 0.1); 0.95 leaves margin.
    assert summary["test"]["test/acc"] >= 0.95 and epochs[-1]["val/acc"] >= 0.95
    assert epochs[-1]["train/loss"] < epochs[0]["train/loss"]

    # metrics.jsonl: one line per epoch (20 updates each), a step line every 50 updates, the test line last.
    assert [m["epoch"] for m in epochs] == [0, 1, 2] and [m["step"] for m in epochs] == [20, 40, 60]
    epoch_keys = {
        "epoch",
        "step",
        "train/loss",
        "train/acc",
        "train/samples_per_sec",
        "lr",
        "val/loss",
        "val/acc",
    }
    if has_loop_timing:  # the bottleneck report: on CUDA peak memory (and GPU use with pynvml), on the CPU CPU use
        epoch_keys |= {"train/data_wait_fraction", "train/step_ms"}
        epoch_keys |= {"train/peak_memory_gb"} if torch.cuda.is_available() else {"train/cpu_util"}
    for m in epochs:
        assert epoch_keys <= set(m) <= epoch_keys | {"train/gpu_util"}
        assert all(isinstance(m[key], (int, float)) for key in epoch_keys)
        # Accuracies count samples: the digits' 1258 training samples (20 batches of 64, the last 42) and 180 val.
        for key, samples in (("train/acc", 1258), ("val/acc", 180)):
            assert m[key] * samples == pytest.approx(round(m[key] * samples), abs=1e-3), key
        # Both speeds measure the epoch's 20 steps: samples/s x ms/step is at most a step's mean 62.9 samples (the
        # epoch's wall time holds the steps), and not far below it (little else happens in an epoch).
        if has_loop_timing:
            assert 0.5 * 1258 / 20 < m["train/samples_per_sec"] * m["train/step_ms"] / 1000 <= 1258 / 20 * 1.001
            assert m["train/data_wait_fraction"] < 0.25  # in-memory batches are slices: not data-bound (see below)
    assert [m["train/acc"] for m in epochs] == sorted(m["train/acc"] for m in epochs)  # it learns, epoch by epoch
    output = run.stderr + run.stdout
    timing = "  data \\d+% of [0-9.]+ ms/step" if has_loop_timing else ""
    assert re.search(rf"epoch +0 .* samples/s{timing}", output)
    assert "data-bound" not in output  # in-memory digits never wait for data: the default run stays silent
    step_lines = [m for m in run.metrics if "train/step_loss" in m]
    assert [(m["epoch"], m["step"]) for m in step_lines] == [(2, 50)]
    assert set(step_lines[0]) == {"epoch", "step", "train/step_loss", "lr", "train/grad_norm"}
    test_line = run.metrics[-1]
    assert test_line == {"epoch": 2, "step": 60, **summary["test"]}

    # summary.json agrees with metrics.jsonl: final = the last epoch, best = the lowest val/loss (the monitor).
    assert summary["world_size"] == 1 and summary["epochs"] == 3 and summary["steps"] == 60
    assert summary["stop_reason"] == "max_epochs"
    assert summary["final"] == epochs[-1]
    best_epoch = min(epochs, key=lambda m: m["val/loss"])
    assert summary["best"] == {key: best_epoch[key] for key in ("epoch", "step", "val/loss", "val/acc")}
    assert summary["optimized_metric"] == "val/acc"
    assert summary["optimized_value"] == summary["best"]["val/acc"]
    assert summary["run_dir"] == str(run.run_dir.resolve()) and summary["wall_seconds"] > 0
    assert summary["device"] == "cpu" or summary["device"].startswith("cuda")

    hydra_config = OmegaConf.load(run.run_dir / ".hydra" / "config.yaml")
    assert (
        hydra_config.trainer.max_epochs == 3 and hydra_config.data.name == "digits"
    )  # the composed config, overrides applied

    # Checkpoints: plain containers, unprefixed model keys, the epoch they say.
    checkpoints = {
        name: torch.load(run.run_dir / "checkpoints" / f"{name}.pt", weights_only=True) for name in ("last", "best")
    }
    for checkpoint in checkpoints.values():
        assert not any(k.startswith(("module.", "_orig_mod.")) for k in checkpoint["model"])
        assert {
            "model",
            "optimizer",
            "scheduler",
            "scaler",
            "early_stopping",
            "best_metrics",
            "epoch",
            "step",
            "batches_done",
            "rng",
            "config",
        } <= set(checkpoint)
        assert len(checkpoint["rng"]) == 1  # one stream set per rank
        assert checkpoint["config"]["trainer"]["max_epochs"] == 3
    last, best = checkpoints["last"], checkpoints["best"]
    assert (last["epoch"], last["step"], last["batches_done"]) == (2, 60, 0)
    assert last["best_metrics"] == summary["best"]
    assert (best["epoch"], best["step"]) == (summary["best"]["epoch"], summary["best"]["step"])
    assert best["early_stopping"]["best"] == summary["best"]["val/loss"]
    if summary["best"]["epoch"] == 2:  # the last epoch was the best: best.pt holds the same weights
        assert all(torch.equal(best["model"][k], v) for k, v in last["model"].items())
    assert not list((run.run_dir / "checkpoints").glob("*.tmp"))
    assert "done in" in run.stderr + run.stdout


def test_test_metrics_use_the_best_checkpoint(run_train):
    # Early stopping on val/loss with a huge min_delta: epoch 0 is the best and stays so. A constant
    # LR makes epoch 0 of this run identical to a 1-epoch run, whose test metrics are then those of
    # epoch 0's weights: the early-stopped run must report exactly them, not those of its last epoch.
    # 5 updates an epoch: quick, so the quick tier sees a test split not run on best.pt's weights.
    overrides = (
        "scheduler=constant",
        "trainer.limit_train_batches=5",
        "trainer.progress_bar=false",
        "print_config=false",
    )
    run = run_train(
        "trainer.max_epochs=6",
        "regularization.early_stopping.min_delta=100",
        "regularization.early_stopping.patience=2",
        *overrides,
    )
    summary = run.summary
    assert summary["stop_reason"] == "early_stopping"
    assert summary["epochs"] == 3  # epoch 0 best, epochs 1 and 2 without improvement -> stop
    assert summary["best"]["epoch"] == 0 and [m["epoch"] for m in run.epoch_metrics()] == [0, 1, 2]
    best = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)
    last = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (best["epoch"], last["epoch"]) == (0, 2)
    assert any(not torch.equal(best["model"][k], v) for k, v in last["model"].items())

    epoch_zero = run_train("trainer.max_epochs=1", *overrides)
    zero_weights = torch.load(epoch_zero.run_dir / "checkpoints" / "best.pt", weights_only=True)["model"]
    for name, tensor in zero_weights.items():  # same weights: the comparison below is meaningful
        torch.testing.assert_close(best["model"][name], tensor, rtol=1e-6, atol=1e-7)
    assert summary["test"] == pytest.approx(epoch_zero.summary["test"], rel=1e-6)


@pytest.mark.slow  # trains in this process (run_train)
def test_a_resume_without_best_pt_tests_the_last_weights_and_says_so(run_train):
    # min_delta=100: epoch 0 stays the best, so epoch 1 of the resume writes no new best.pt.
    tiny = ("trainer.limit_train_batches=3", "trainer.limit_val_batches=2", "trainer.progress_bar=false")
    first = run_train(*tiny, "trainer.max_epochs=1", "regularization.early_stopping.min_delta=100")
    assert first.summary["test_weights"] == "best"
    best = first.run_dir / "checkpoints" / "best.pt"
    best.unlink()
    resumed = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir)
    warnings = [line for line in (resumed.stdout + resumed.stderr).splitlines() if "best.pt" in line]
    assert len(warnings) == 1 and f"{best} is missing: testing the last weights" in warnings[0]
    summary = resumed.summary
    assert summary["test_weights"] == "last (best.pt missing)" and summary["best"]["epoch"] == 0
    assert not best.exists() and summary["epochs"] == 2


@pytest.mark.slow  # trains in this process (run_train)
def test_lr_schedule_warms_up_then_decays_per_update(run_train):
    run = run_train(
        "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "scheduler.warmup_epochs=1", "trainer.progress_bar=false"
    )
    lrs = [m["lr"] for m in run.metrics if "train/step_loss" in m]
    updates_per_epoch = len(lrs) // 2
    warmup, decay = lrs[:updates_per_epoch], lrs[updates_per_epoch:]
    assert warmup == sorted(warmup) and warmup[-1] == pytest.approx(0.1, rel=0.01)
    assert decay == sorted(decay, reverse=True) and decay[-1] < 1e-3


@pytest.mark.slow  # trains in this process (run_train)
def test_a_max_steps_run_shorter_than_the_warmup_still_reaches_the_peak_lr(run_train):
    # cosine's one warmup epoch is 20 updates; max_steps=7 cuts it to 3, so the LR peaks at 0.1, then decays.
    run = run_train("trainer.max_steps=7", "trainer.log_every_n_steps=1", "trainer.progress_bar=false")
    lrs = [m["lr"] for m in run.metrics if "train/step_loss" in m]  # the LR of the next update, after each
    assert len(lrs) == 7 and max(lrs) == pytest.approx(0.1) and lrs.index(max(lrs)) == 1
    assert lrs[1:] == sorted(lrs[1:], reverse=True) and lrs[-1] < 0.05
    output = run.stderr + run.stdout
    assert "for 7 updates (trainer.max_steps; 20 updates an epoch)" in output and "20 epochs" not in output
    assert output.count("warming up over 3 updates") == 1
    assert "mid-epoch checkpoints" not in output and "compile + first step" not in output  # options off: silent


@pytest.mark.slow  # trains in this process (run_train)
def test_mid_epoch_checkpoints_are_counted_in_the_log(run_train):
    # 20 updates an epoch, a save every 7 inside an epoch: epoch 0 at 7 and 14, epoch 1 at 21, 28 and 35.
    run = run_train("trainer.max_epochs=2", "trainer.checkpoint_every_n_steps=7", "trainer.progress_bar=false")
    counts = re.findall(r"epoch +(\d+) +(\d+) mid-epoch checkpoints \(every 7 updates\)", run.stderr + run.stdout)
    assert counts == [("0", "2"), ("1", "3")]


@pytest.mark.slow  # torch.compile on the CPU: about a minute with a cold inductor cache
def test_compile_time_is_logged_apart_from_throughput(run_train):
    # torch.compile on the CPU: about a minute with a cold inductor cache, seconds with a warm one.
    run = run_train(
        "trainer.compile=true", "trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.progress_bar=false"
    )
    output = run.stderr + run.stdout
    seconds = [float(s) for s in re.findall(r"compile \+ first step: ([0-9.]+)s", output)]
    assert len(seconds) == 1 and seconds[0] > 0  # the first epoch compiles; the second does not
    # 4 batches of 64, the first timed apart: epoch 0's throughput counts the 192 samples after it.
    epochs = run.epoch_metrics()
    assert all(m["train/samples_per_sec"] > 0 for m in epochs)


@pytest.mark.slow  # trains in a subprocess
def test_resume_after_a_kill_continues_exactly_in_the_same_run_directory(run_train, tmp_path):
    # Checkpoints every 3 updates, so the kill lands inside an epoch. min_delta=100 keeps epoch 0 the
    # best, before the kill: the resumed run must test that run directory's best.pt, as a straight run does.
    overrides = [
        "trainer.max_epochs=3",
        "augmentation=shift",
        "trainer.progress_bar=false",
        "print_config=false",
        "regularization.early_stopping.enabled=false",
        "regularization.early_stopping.min_delta=100",
        "trainer.checkpoint_every_n_steps=3",
    ]
    straight = run_train(*overrides)
    # Kill a second, identical run as soon as epoch 0's best.pt lands, as a preemption would.
    killed_dir = tmp_path / "killed"
    victim = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={killed_dir}", *overrides],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last, best = killed_dir / "checkpoints" / "last.pt", killed_dir / "checkpoints" / "best.pt"
    deadline = time.monotonic() + 120
    while not best.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    victim.kill()
    victim.wait()
    interrupted = torch.load(last, weights_only=True)
    assert interrupted["epoch"] < 2, "the run finished before it could be killed"
    (killed_dir / "checkpoints" / "last.pt.tmp").write_bytes(b"torn")  # as a kill during a save leaves it
    # resume= alone: the checkpoint's config (not the defaults), in the killed run's own directory.
    resumed = run_train(f"resume={killed_dir}", run_dir=killed_dir)
    assert not list((killed_dir / "checkpoints").glob("*.tmp")) and "last.pt.tmp" in resumed.stdout + resumed.stderr
    assert "config as in the checkpoint" in resumed.stdout + resumed.stderr
    assert resumed.summary["best"]["epoch"] == 0
    resumed_summary, straight_summary = resumed.summary, straight.summary
    timings = {"train/samples_per_sec", "train/data_wait_fraction", "train/step_ms"}
    timings |= {"train/cpu_util", "train/gpu_util", "train/peak_memory_gb"}
    for summary in (resumed_summary, straight_summary):  # times and utilization are measures, not results
        del summary["wall_seconds"], summary["run_dir"]
        summary["final"] = {key: value for key, value in summary["final"].items() if key not in timings}
    assert resumed_summary.pop("test") == pytest.approx(straight_summary.pop("test"), rel=1e-6)
    assert resumed_summary == straight_summary  # best, final, epochs, steps, stop_reason, optimized value
    # metrics.jsonl continues: each epoch once, with the lines written after the checkpoint dropped.
    assert [m["epoch"] for m in resumed.epoch_metrics()] == list(range(3))
    assert_same_training(resumed, straight)


@pytest.mark.slow  # trains in this process (run_train)
def test_a_run_stopped_inside_an_epoch_resumes_at_the_next_batch(run_train):
    # A constant LR, so stopping early with max_steps does not change the schedule.
    overrides = [
        "trainer.max_epochs=2",
        "augmentation=shift",
        "scheduler=constant",
        "trainer.progress_bar=false",
        "print_config=false",
        "regularization.early_stopping.enabled=false",
    ]
    straight = run_train(*overrides)
    stopped = run_train(*overrides, "trainer.max_steps=27")  # 20 updates per epoch: 7 batches into epoch 1
    checkpoint = torch.load(stopped.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (checkpoint["epoch"], checkpoint["batches_done"], checkpoint["step"]) == (1, 7, 27)
    last = stopped.run_dir / "checkpoints" / "last.pt"
    finished = run_train(f"resume={last}", run_dir=stopped.run_dir)  # its config says max_steps=27
    assert (
        "has finished (trainer.max_steps=27 reached); resume with a higher trainer.max_steps"
        in finished.stdout + finished.stderr
    )
    resumed = run_train(f"resume={last}", "trainer.max_steps=null", run_dir=stopped.run_dir)
    assert "changed: trainer.max_steps 27 -> None" in resumed.stdout + resumed.stderr
    assert [m["epoch"] for m in resumed.epoch_metrics()] == [0, 1]  # the stopped epoch 1's line is replaced
    assert resumed.epoch_metrics()[1]["step"] == 40
    assert_same_training(resumed, straight)


@pytest.mark.slow  # trains in this process (run_train)
def test_resume_auto_starts_then_continues_and_overrides_take_effect(run_train, tmp_path):
    run_dir = tmp_path / "job"  # a fixed directory, as a requeued SLURM job names it by its job id
    tiny = (
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "scheduler=constant",
        "trainer.progress_bar=false",
        "print_config=false",
    )
    first = run_train("resume=auto", "trainer.max_epochs=1", *tiny, run_dir=run_dir)
    assert "resume=auto: no checkpoint" in first.stdout + first.stderr
    second = run_train("resume=auto", "trainer.max_epochs=2", "optimizer.lr=0.05", *tiny, run_dir=run_dir)
    assert "changed: trainer.max_epochs 1 -> 2, optimizer.lr 0.1 -> 0.05" in second.stdout + second.stderr
    assert [(m["epoch"], m["lr"]) for m in second.epoch_metrics()] == [(0, 0.1), (1, 0.05)]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["config"]["optimizer"]["lr"] == 0.05
    again = run_train("resume=auto", "trainer.max_epochs=2", "optimizer.lr=0.05", *tiny, run_dir=run_dir)
    assert (
        "has finished (trainer.max_epochs=2 reached); resume with a higher trainer.max_epochs"
        in again.stdout + again.stderr
    )
    assert again.metrics == second.metrics  # nothing trained, nothing logged


@pytest.mark.slow  # trains in this process (run_train)
@pytest.mark.parametrize("stop", ["max_epochs", "early_stopping"])
def test_a_run_killed_during_its_test_is_tested_by_a_resume(run_train, stop):
    # A kill after the last checkpoint, before summary.json, leaves every checkpoint and maybe the test
    # line, but no summary: the resume trains nothing, tests, and writes the summary a straight run writes.
    tiny = ("trainer.limit_train_batches=3", "trainer.limit_val_batches=2", "trainer.progress_bar=false")
    stops = {
        "max_epochs": ("trainer.max_epochs=2",),
        "early_stopping": (
            "trainer.max_epochs=6",
            "regularization.early_stopping.min_delta=100",
            "regularization.early_stopping.patience=1",
        ),
    }
    run = run_train(*tiny, *stops[stop])
    straight, epoch_lines = run.summary, run.epoch_metrics()
    assert straight["stop_reason"] == stop
    (run.run_dir / "summary.json").unlink()  # the test line stays in metrics.jsonl, as a kill may leave it

    resumed = run_train("resume=auto", run_dir=run.run_dir)  # as a sweep's requeued job resumes
    assert "has no summary.json (stopped during its test): testing it now" in resumed.stdout + resumed.stderr
    summary = resumed.summary
    assert summary.pop("test") == pytest.approx(straight.pop("test"), rel=1e-6)
    del summary["wall_seconds"], straight["wall_seconds"]
    assert summary == straight  # best, final, epochs, steps, stop_reason, the optimized value
    assert resumed.epoch_metrics() == epoch_lines  # no epoch trained again
    assert len([m for m in resumed.metrics if "test/acc" in m]) == 1  # the killed run's test line is replaced

    again = run_train("resume=auto", run_dir=run.run_dir)
    assert "has finished" in again.stdout + again.stderr and again.metrics == resumed.metrics


@pytest.mark.slow  # trains in this process (run_train)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(run_train, precision):
    # One epoch of batches of 32 at a constant LR (half the samples of 2 default epochs: fp16 on a
    # CPU is emulated and slow) reaches about 0.975 test accuracy in fp16 and 0.98 in bf16 and fp32.
    run = run_train(
        f"precision={precision}",
        "trainer.max_epochs=1",
        "data.batch_size=32",
        "scheduler=constant",
        "trainer.progress_bar=false",
    )
    assert run.summary["test"]["test/acc"] >= 0.9
    # fp16 autocast on a CPU is emulated and many times slower: said once, with the way out.
    warnings = (run.stderr + run.stdout).count("precision=fp16 on the CPU is emulated")
    on_cpu = run.summary["device"] == "cpu"
    assert warnings == (1 if precision == "fp16" and on_cpu else 0)


@pytest.mark.slow  # trains in this process (run_train)
def test_gradient_clipping_accumulation_and_max_steps_run_together(run_train):
    run = run_train(
        "trainer.max_epochs=3",
        "trainer.grad_clip=0.5",
        "trainer.accumulate_grad_batches=3",
        "trainer.max_steps=10",
        "trainer.progress_bar=false",
    )
    assert run.summary["steps"] == 10 and run.summary["stop_reason"] == "max_steps"
    # 20 batches an epoch in groups of 3: 7 updates (the last group of 2), then 3 more updates = 9 batches.
    assert [(m["epoch"], m["step"]) for m in run.epoch_metrics()] == [(0, 7), (1, 10)]
    checkpoint = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (checkpoint["epoch"], checkpoint["step"], checkpoint["batches_done"]) == (1, 10, 9)


@pytest.mark.slow  # trains in this process (run_train)
def test_debug_fast_limits_batches(run_train):
    run = run_train("debug=fast")
    epochs = run.epoch_metrics()
    assert len(epochs) == 2 and epochs[-1]["step"] == 6


@needs_image_folders
@pytest.mark.slow  # trains in this process (run_train)
def test_imagefolder_infers_its_classes(run_train, tmp_path):
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for split, count in (("train", 12), ("val", 4), ("test", 4)):
        for label, colour in enumerate(("red", "blue", "green")):
            folder = tmp_path / "images" / split / colour
            folder.mkdir(parents=True)
            for i in range(count):
                noise = torch.randint(0, 40, (20, 24, 3), generator=rng).to(torch.uint8)
                pixels = noise + torch.tensor([200 if c == label else 0 for c in range(3)], dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    run = run_train(
        "data=imagefolder",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=16",
        "data.num_workers=0",
        "data.batch_size=8",
        "trainer.max_epochs=4",
        "trainer.progress_bar=false",
        "optimizer.lr=0.05",
    )
    assert run.summary["test"]["test/acc"] >= 0.9  # each class is one colour: 4 epochs reach 1.0
    config = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)["config"]
    assert config["data"]["num_classes"] == 3 and config["model"]["num_classes"] == 3


def test_help_lists_the_groups_and_cfg_prints_the_config(run_train):
    help_text = run_train("--help").stdout
    for group in (
        "data",
        "model",
        "optimizer",
        "scheduler",
        "precision",
        "distributed",
        "regularization",
        "augmentation",
        "logger",
        "experiment",
        "debug",
    ):
        assert f"{group}:" in help_text, group
    assert all(option.stem in help_text for option in (ROOT / "conf" / "data").glob("*.yaml"))
    config = run_train("--cfg", "job").stdout
    assert "max_epochs: 20" in config and "label_smoothing" in config
