"""DDP on CPU with gloo: every way to launch, and the checklist in DESIGN.md, each by a test."""
import gc
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import ROOT
from trainkit.augment import BatchTransform
from trainkit.data import TensorLoader
from trainkit.distributed import first_slurm_host, gather_objects
from trainkit.models import SmallCNN
from trainkit.runtime import seed_everything

TESTS = Path(__file__).resolve().parent
QUICK = ["trainer.max_epochs=2", "trainer.progress_bar=false", "augmentation=none"]
NO_NORM_MODEL = ["model._target_=models_for_tests.NoNormCNN", "model.widths=[16,32]"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_with_tests_on_path(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **extra}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    return env


def run(command: list[str], cwd: Path = ROOT, timeout: int = 240, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env_with_tests_on_path(**extra_env), capture_output=True, text=True,
                          timeout=timeout)


def train_command(*overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *overrides]


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics


# ---- in-process checks with torch.multiprocessing (fast) ----------------------------------------

def _init(rank: int, world_size: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)


def _evaluate_uneven_split(rank: int, world_size: int, port: int, results) -> None:
    sys.path.insert(0, str(ROOT))
    import train

    _init(rank, world_size, port)
    try:
        torch.manual_seed(0)
        model = SmallCNN(1, 10).eval()
        images = torch.rand(101, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        labels = torch.randint(0, 10, (101,), generator=torch.Generator().manual_seed(2))
        loader = TensorLoader(images, labels, 16, shuffle=False, rank=rank, world_size=world_size)
        metrics = train.evaluate(model, loader, lambda x: x, "fp32", torch.device("cpu"))
        results[rank] = metrics
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_evaluation_over_an_uneven_split_counts_every_sample_once():
    sys.path.insert(0, str(ROOT))
    import train

    torch.manual_seed(0)
    model = SmallCNN(1, 10).eval()
    images = torch.rand(101, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (101,), generator=torch.Generator().manual_seed(2))
    single = train.evaluate(model, TensorLoader(images, labels, 16, shuffle=False), lambda x: x, "fp32", torch.device("cpu"))
    results = mp.Manager().dict()
    mp.spawn(_evaluate_uneven_split, args=(2, free_port(), results), nprocs=2)
    for rank in (0, 1):
        assert results[rank]["samples"] == 101
        assert results[rank]["acc"] == pytest.approx(single["acc"], abs=1e-9)
        assert results[rank]["loss"] == pytest.approx(single["loss"], rel=1e-5)


def _initial_weights_and_augmentation(rank: int, world_size: int, port: int, results) -> None:
    _init(rank, world_size, port)
    try:
        seed_everything(7 + rank)  # as train.py does: a different stream per rank
        model = torch.nn.parallel.DistributedDataParallel(SmallCNN(1, 10))
        transform = BatchTransform((0.5,), (0.5,), 8, {"name": "shift", "crop_padding": 0.25}, train=True)
        augmented = transform(torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(0)))
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = gather_objects((weights, augmented))
        results[rank] = [(w.clone(), a.clone()) for w, a in gathered]
        del model  # free DDP's reducer before its process group goes (else gloo may abort)
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_initial_weights_agree_while_augmentation_differs_per_rank():
    results = mp.Manager().dict()
    mp.spawn(_initial_weights_and_augmentation, args=(2, free_port(), results), nprocs=2)
    (weights0, augmented0), (weights1, augmented1) = results[0]
    assert torch.equal(weights0, weights1)
    assert not torch.equal(augmented0, augmented1)


def _average_batchnorm(rank: int, world_size: int, port: int, results) -> None:
    from trainkit.distributed import average_batchnorm_statistics

    _init(rank, world_size, port)
    try:
        model = SmallCNN(1, 10)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.fill_(float(rank))  # each rank saw different data
                module.running_var.fill_(1.0 + 2 * rank)
        average_batchnorm_statistics(model)
        bn = model.features[1]
        results[rank] = (bn.running_mean.clone(), bn.running_var.clone())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_batchnorm_statistics_are_averaged_across_ranks():
    results = mp.Manager().dict()
    mp.spawn(_average_batchnorm, args=(2, free_port(), results), nprocs=2)
    for rank in (0, 1):
        mean, var = results[rank]
        assert torch.allclose(mean, torch.full_like(mean, 0.5)) and torch.allclose(var, torch.full_like(var, 2.0))


def test_first_slurm_host_reads_compressed_node_lists():
    assert first_slurm_host("gpu[03-05,09],cpu1").startswith("gpu")  # scontrol when present, else our parser
    assert first_slurm_host("node7") == "node7"


# ---- train.py end to end, every launcher ----------------------------------------------------------

@pytest.mark.slow
def test_two_processes_with_half_batches_match_one_process(tmp_path):
    overrides = [*QUICK, *NO_NORM_MODEL, "trainer.log_every_n_steps=1", "regularization.early_stopping.enabled=false"]
    single = run(train_command(f"hydra.run.dir={tmp_path / 'single'}", "data.batch_size=64", *overrides))
    assert single.returncode == 0, single.stderr[-3000:]
    double = run(train_command(f"hydra.run.dir={tmp_path / 'ddp'}", "data.batch_size=32", "distributed=ddp",
                               "distributed.nproc_per_node=2", *overrides))
    assert double.returncode == 0, double.stderr[-3000:]
    (single_summary, single_metrics), (ddp_summary, ddp_metrics) = read_run(tmp_path / "single"), read_run(tmp_path / "ddp")
    assert ddp_summary["world_size"] == 2 and single_summary["world_size"] == 1
    single_steps = [m["train/step_loss"] for m in single_metrics if "train/step_loss" in m]
    ddp_steps = [m["train/step_loss"] for m in ddp_metrics if "train/step_loss" in m]
    assert len(single_steps) == len(ddp_steps) > 20
    assert ddp_steps == pytest.approx(single_steps, abs=1e-4)
    for key in ("train/loss", "val/loss", "val/acc"):
        assert [m[key] for m in ddp_metrics if key in m] == pytest.approx([m[key] for m in single_metrics if key in m], abs=1e-4)
    single_weights = torch.load(tmp_path / "single/checkpoints/last.pt", weights_only=True)["model"]
    ddp_weights = torch.load(tmp_path / "ddp/checkpoints/last.pt", weights_only=True)["model"]
    assert single_weights.keys() == ddp_weights.keys()  # no `module.` prefix
    for name in single_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_accumulation_under_ddp_matches_the_big_batch(tmp_path):
    # 2 ranks x 2 micro-steps of 16 (no_sync on the first) == 1 process x 64, over 19 full updates
    # (the epoch's short tail is left out: there micro-batches of unequal size weigh differently).
    overrides = [*QUICK, *NO_NORM_MODEL, "regularization.early_stopping.enabled=false", "trainer.max_epochs=1"]
    single = run(train_command(f"hydra.run.dir={tmp_path / 'single'}", "data.batch_size=64",
                               "trainer.limit_train_batches=19", *overrides))
    double = run(train_command(f"hydra.run.dir={tmp_path / 'ddp'}", "data.batch_size=16", "trainer.accumulate_grad_batches=2",
                               "trainer.limit_train_batches=38", "distributed=ddp", "distributed.nproc_per_node=2", *overrides))
    assert single.returncode == 0 and double.returncode == 0, double.stderr[-3000:]
    single_weights = torch.load(tmp_path / "single/checkpoints/last.pt", weights_only=True)["model"]
    ddp_weights = torch.load(tmp_path / "ddp/checkpoints/last.pt", weights_only=True)["model"]
    for name in single_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_self_launched_ddp_inside_a_hydra_multirun(tmp_path):
    result = run(train_command("-m", f"hydra.sweep.dir={tmp_path}", "distributed=ddp", "distributed.nproc_per_node=2",
                               "seed=1,2", *QUICK, "trainer.limit_train_batches=3"))
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        summary, _ = read_run(tmp_path / job)
        assert summary["world_size"] == 2


@pytest.mark.slow
def test_torchrun_single_node_shares_one_run_directory(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = run([*torchrun, str(ROOT / "train.py"), *QUICK], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dirs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs  # no directory per rank
    summary, _ = read_run(run_dirs[0])
    assert summary["world_size"] == 2
    assert (run_dirs[0] / ".hydra" / "config.yaml").exists()
    assert len((run_dirs[0] / "metrics.jsonl").read_text().splitlines()) == 3  # rank 0 alone logs: 2 epochs + test


@pytest.mark.slow
def test_two_torchrun_agents_form_one_two_node_job(tmp_path):
    port = free_port()
    agents = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                          "--nproc_per_node=1", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_backend=static",
                          str(ROOT / "train.py"), *QUICK],
                         cwd=tmp_path, env=env_with_tests_on_path(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    outputs = [agent.communicate(timeout=240) for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), outputs[0][1][-2000:] + outputs[1][1][-2000:]
    run_dirs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    summary, _ = read_run(run_dirs[0])
    assert summary["world_size"] == 2 and summary["test"]["test/acc"] > 0.5


@pytest.mark.slow
def test_simulated_slurm_tasks_join_one_process_group(tmp_path):
    job_id = str(40000 + free_port() % 10000)
    tasks = [
        subprocess.Popen(train_command(f"hydra.run.dir={tmp_path}", *QUICK), cwd=ROOT,
                         env=env_with_tests_on_path(SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2",
                                                    SLURM_NTASKS_PER_NODE="2", SLURM_JOB_ID=job_id,
                                                    SLURM_JOB_NODELIST="127.0.0.1"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    outputs = [task.communicate(timeout=240) for task in tasks]
    assert all(task.returncode == 0 for task in tasks), outputs[0][1][-2000:] + outputs[1][1][-2000:]
    summary, _ = read_run(tmp_path)
    assert summary["world_size"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["self", "torchrun"])
def test_a_crashing_rank_ends_the_whole_job_quickly(tmp_path, launcher):
    overrides = [*QUICK, "model._target_=models_for_tests.CrashOnRankOne", "model.widths=[16,32]", "trainer.max_epochs=50"]
    if launcher == "self":
        command = train_command(f"hydra.run.dir={tmp_path}", "distributed=ddp", "distributed.nproc_per_node=2", *overrides)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   str(ROOT / "train.py"), f"hydra.run.dir={tmp_path}", *overrides]
    started = time.monotonic()
    result = run(command, timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "simulated crash on rank 1" in result.stderr


@pytest.mark.slow
def test_all_ranks_stop_together_on_a_non_finite_loss(tmp_path):
    result = run(train_command(f"hydra.run.dir={tmp_path}", "distributed=ddp", "distributed.nproc_per_node=2",
                               *QUICK, *NO_NORM_MODEL, "optimizer.lr=1e12", "trainer.max_epochs=5"), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary, _ = read_run(tmp_path)
    assert summary["stop_reason"] == "non-finite loss" and summary["epochs"] == 1


@pytest.mark.slow
def test_sync_batchnorm_on_cpu_is_refused_with_a_clear_error(tmp_path):
    result = run(train_command(f"hydra.run.dir={tmp_path}", "distributed=ddp", "distributed.nproc_per_node=2",
                               "distributed.sync_batchnorm=true", *QUICK), timeout=120)
    assert result.returncode != 0
    assert "distributed.sync_batchnorm" in result.stderr and "CUDA" in result.stderr


@pytest.mark.slow
def test_ddp_run_stopped_inside_an_epoch_resumes_exactly(tmp_path):
    # Constant LR, so stopping with max_steps leaves the schedule alone; every rank's RNG (its own
    # augmentation stream) is restored. BN-free: the stop averages BatchNorm statistics across ranks
    # one extra time, which a straight run does not do at that point.
    overrides = [*QUICK, *NO_NORM_MODEL, "augmentation=shift", "scheduler=constant", "regularization.early_stopping.enabled=false",
                 "distributed=ddp", "distributed.nproc_per_node=2", "trainer.checkpoint_every_n_steps=4"]
    straight = run(train_command(f"hydra.run.dir={tmp_path / 'straight'}", *overrides))
    stopped = run(train_command(f"hydra.run.dir={tmp_path / 'stopped'}", "trainer.max_steps=13", *overrides))
    assert straight.returncode == 0 and stopped.returncode == 0, stopped.stderr[-3000:]
    checkpoint = torch.load(tmp_path / "stopped/checkpoints/last.pt", weights_only=True)
    assert (checkpoint["epoch"], checkpoint["batches_done"], len(checkpoint["rng"])) == (1, 3, 2)
    resumed = run(train_command(f"hydra.run.dir={tmp_path / 'resumed'}", f"resume={tmp_path / 'stopped/checkpoints/last.pt'}",
                                *overrides))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (straight_summary, straight_metrics), (resumed_summary, resumed_metrics) = (
        read_run(tmp_path / "straight"), read_run(tmp_path / "resumed"))
    assert resumed_summary["test"] == pytest.approx(straight_summary["test"], rel=1e-6)
    assert resumed_metrics[-2]["val/loss"] == pytest.approx(straight_metrics[-2]["val/loss"], rel=1e-6)
    straight_weights = torch.load(tmp_path / "straight/checkpoints/last.pt", weights_only=True)["model"]
    resumed_weights = torch.load(tmp_path / "resumed/checkpoints/last.pt", weights_only=True)["model"]
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7)
