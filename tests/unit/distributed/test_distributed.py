"""DDP on CPU with gloo: every way to launch, and the checklist in DESIGN.md, each by a test."""

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from conftest import ROOT, end_all, finish, run_here, torchrun
from trainkit.augment.batch_transform import BatchTransform
from trainkit.data import TensorLoader
from trainkit.distributed.process_group import first_slurm_host, gather_objects
from trainkit.errors import ConfigError
from trainkit.models.small_cnn import SmallCNN
from trainkit.runtime import seed_everything
from trainkit.tasks import evaluate
from trainkit.tasks.classification import Classification

pytestmark = pytest.mark.usefixtures("one_thread")  # the runs in this process (a reference, an evaluation)

TESTS = Path(__file__).resolve().parents[2]
QUICK = ["trainer.max_epochs=2", "trainer.progress_bar=false", "augmentation=none"]
NO_NORM_MODEL = ["model._target_=models_for_tests.NoNormCNN", "model.widths=[16,32]"]

CLASSIFICATION = Classification(num_classes=10)  # evaluate's task: cross-entropy and accuracy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_with_tests_on_path(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **extra}
    # One thread per process, as torchrun gives each of several workers: a process that a SLURM task, a one-worker
    # agent or a plain train.py start would spin a thread per core, and two of them on a loaded 2-core machine take
    # several times as long.
    env.setdefault("OMP_NUM_THREADS", "1")
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    return env


def run(command: list[str], cwd: Path = ROOT, timeout: int = 240, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, env=env_with_tests_on_path(**extra_env), capture_output=True, text=True, timeout=timeout
    )


def train_command(*overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *overrides]


def ddp_command(*overrides: str) -> list[str]:
    """train.py in 2 processes that torchrun starts (the core's way; tests/unit/distributed/test_local_launch.py has
    train.py start them itself)."""
    return [*torchrun(2), str(ROOT / "train.py"), *overrides]


def workers_output(output: str) -> str:
    """What the processes printed: `output` without torchrun's own report of a failed one (its traceback and table)."""
    return output.split('Traceback (most recent call last):\n  File "<frozen runpy>"')[0]


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics


# ---- in-process checks with torch.multiprocessing (fast) ----------------------------------------


def _init(rank: int, world_size: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)


# Each check below runs on every rank of one gloo process group and returns what that rank saw.
# One start of the ranks runs them all, one after another (each sets its own seeds), and the tests
# after them assert on what `process_group_checks` collected. The ranks are forked: a spawned one
# pays seconds for its own imports.


def _evaluate_uneven_split(rank: int, world_size: int):
    torch.manual_seed(0)
    model = SmallCNN(1, 10).eval()
    images = torch.rand(101, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (101,), generator=torch.Generator().manual_seed(2))
    loader = TensorLoader(images, labels, 16, shuffle=False, rank=rank, world_size=world_size)
    return evaluate(model, loader, lambda x: x, CLASSIFICATION, "fp32", torch.device("cpu"))


def _average_batchnorm(rank: int, world_size: int):
    from trainkit.distributed.process_group import average_batchnorm_statistics

    model = SmallCNN(1, 10)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.fill_(float(rank))  # each rank saw different data
            module.running_var.fill_(1.0 + 2 * rank)
    average_batchnorm_statistics(model)
    bn = model.features[1]
    return bn.running_mean.clone(), bn.running_var.clone()


def _initial_weights_and_augmentation(rank: int, world_size: int):
    seed_everything(7 + rank)  # as train.py does: a different stream per rank
    model = torch.nn.parallel.DistributedDataParallel(SmallCNN(1, 10))
    transform = BatchTransform((0.5,), (0.5,), 8, {"name": "shift", "crop_padding": 0.25}, train=True)
    augmented = transform(torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(0)))
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = gather_objects((weights, augmented))
    del model  # free DDP's reducer before its process group goes (else gloo may abort)
    gc.collect()
    return [(w.clone(), a.clone()) for w, a in gathered]


def _agree_on_a_stop_signal(rank: int, world_size: int):
    from trainkit.checkpointing.signals import stop_on_signals, stop_signal

    with stop_on_signals():
        if rank == 1:  # e.g. `kill` of one worker: rank 0 has not received it
            os.kill(os.getpid(), signal.SIGTERM)
        cpu = torch.device("cpu")
        return stop_signal(cpu, agree=False), stop_signal(cpu, agree=True)


PROCESS_GROUP_CHECKS = [_evaluate_uneven_split, _average_batchnorm, _initial_weights_and_augmentation]
PROCESS_GROUP_CHECKS += [_agree_on_a_stop_signal]


def _run_process_group_checks(rank: int, world_size: int, port: int, results) -> None:
    torch.set_num_threads(1)  # OpenMP's threads do not survive a fork: one thread, as a DataLoader's worker
    _init(rank, world_size, port)
    try:
        results[rank] = {check.__name__: check(rank, world_size) for check in PROCESS_GROUP_CHECKS}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def process_group_checks() -> list[dict]:
    """[rank 0's, rank 1's] {check name: what it returned} for PROCESS_GROUP_CHECKS."""
    import torch._dynamo  # noqa: F401  (DistributedDataParallel imports it as it is built: here, not in each rank)

    results = mp.Manager().dict()
    mp.start_processes(_run_process_group_checks, args=(2, free_port(), results), nprocs=2, start_method="fork")
    return [results[0], results[1]]


@pytest.mark.slow
def test_evaluation_over_an_uneven_split_counts_every_sample_once(process_group_checks):
    torch.manual_seed(0)
    model = SmallCNN(1, 10).eval()
    images = torch.rand(101, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (101,), generator=torch.Generator().manual_seed(2))
    single = evaluate(
        model, TensorLoader(images, labels, 16, shuffle=False), lambda x: x, CLASSIFICATION, "fp32", torch.device("cpu")
    )
    for rank in (0, 1):
        metrics = process_group_checks[rank]["_evaluate_uneven_split"]
        assert metrics["samples"] == 101
        assert metrics["acc"] == pytest.approx(single["acc"], abs=1e-9)
        assert metrics["loss"] == pytest.approx(single["loss"], rel=1e-5)


@pytest.mark.slow
def test_a_stop_signal_one_rank_received_stops_every_rank_where_they_agree(process_group_checks):
    rank0, rank1 = (checks["_agree_on_a_stop_signal"] for checks in process_group_checks)
    # Between agreement points no rank stops (not even the one that has it); at one, every rank does.
    assert rank0 == rank1 == (None, "SIGTERM")


@pytest.mark.slow
def test_initial_weights_agree_while_augmentation_differs_per_rank(process_group_checks):
    (weights0, augmented0), (weights1, augmented1) = process_group_checks[0]["_initial_weights_and_augmentation"]
    assert torch.equal(weights0, weights1)
    assert not torch.equal(augmented0, augmented1)


@pytest.mark.slow
def test_batchnorm_statistics_are_averaged_across_ranks(process_group_checks):
    for rank in (0, 1):
        mean, var = process_group_checks[rank]["_average_batchnorm"]
        assert torch.allclose(mean, torch.full_like(mean, 0.5)) and torch.allclose(var, torch.full_like(var, 2.0))


def test_first_slurm_host_reads_compressed_node_lists():
    # scontrol when present, else our parser: both give the first host of the expanded list.
    assert first_slurm_host("gpu[03-05,09],cpu1") == "gpu03"
    assert first_slurm_host("node[7-8]") == "node7"
    assert first_slurm_host("node7,node2") == "node7"
    assert first_slurm_host("node7") == "node7"


# ---- train.py end to end, every launcher ----------------------------------------------------------


def records(directory: Path) -> list[dict]:
    return [json.loads((directory / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def recorded_ddp_run(tmp_path_factory):
    """One 2-rank train.py run of models_for_tests.RecordingCNN (with BatchNorm): 2 epochs of 4
    micro-batches per rank, 2 micro-batches per update. Returns (the run directories it made, [rank 0's record,
    rank 1's]).

    Started in a directory of its own without hydra.run.dir, as from a shell, so that the same run shows where the
    ranks write (test_torchrun_single_node_shares_one_run_directory): the recording model changes nothing there."""
    root = tmp_path_factory.mktemp("recorded")
    (root / "records").mkdir()
    result = run(
        ddp_command(
            *QUICK,
            "distributed=ddp",
            "model._target_=models_for_tests.RecordingCNN",
            "model.widths=[16,32]",
            f"+model.record_dir={root / 'records'}",
            "+model.batchnorm=true",
            "trainer.limit_train_batches=4",
            "trainer.accumulate_grad_batches=2",
            "regularization.early_stopping.enabled=false",
        ),
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return list((root / "outputs" / "runs").iterdir()), records(root / "records")


@pytest.mark.slow
def test_ranks_draw_their_own_random_streams_and_start_from_rank_zeros_weights(recorded_ddp_run):
    _, (rank0, rank1) = recorded_ddp_run
    # seed + rank: each rank's stream (augmentation, dropout) differs; so do the weights as built...
    assert rank0["init"]["draw"] != rank1["init"]["draw"]
    assert rank0["init"]["weights"] != rank1["init"]["weights"]
    # ...until DDP broadcasts rank 0's: training starts from them on every rank.
    assert rank0["train"][0]["weights"] == rank1["train"][0]["weights"] == rank0["init"]["weights"]


@pytest.mark.slow
def test_ranks_train_on_their_own_shard_and_every_epoch_reshuffles(recorded_ddp_run):
    _, (rank0, rank1) = recorded_ddp_run
    assert len(rank0["train"]) == len(rank1["train"]) == 8  # 2 epochs x 4 micro-batches on every rank
    assert all(a["inputs"] != b["inputs"] for a, b in zip(rank0["train"], rank1["train"]))  # sharded, not copied
    for rank in (rank0, rank1):  # set_epoch: epoch 1's first batch is not epoch 0's (augmentation is off)
        assert rank["train"][4]["inputs"] != rank["train"][0]["inputs"]


@pytest.mark.slow
def test_accumulation_skips_the_all_reduce_on_micro_steps_that_do_not_update(recorded_ddp_run):
    # Each training forward pass records the gradient left by the micro-step before it. After a
    # micro-step that does not update, each rank holds its own shard's gradient (no_sync): they
    # differ. Had that backward all-reduced, they would be identical. After an update, none.
    _, (rank0, rank1) = recorded_ddp_run
    for index, (a, b) in enumerate(zip(rank0["train"], rank1["train"])):
        if index % 2 == 0:  # first micro-step of a group: the optimizer zeroed the gradients
            assert a["grad"] is None and b["grad"] is None, index
        else:
            assert a["grad"] is not None and b["grad"] is not None and a["grad"] != b["grad"], index
        assert a["weights"] == b["weights"], index  # updates themselves are all-reduced: weights agree


@pytest.mark.slow
def test_batchnorm_statistics_are_averaged_across_ranks_before_evaluation_and_checkpoints(recorded_ddp_run):
    [run_dir], (rank0, rank1) = recorded_ddp_run
    # Each rank's running statistics after its last training pass of the epoch, then what the
    # validation pass of that epoch uses: their mean, on both ranks (not rank 0's alone).
    evaluations = [(3, 0), (7, 1)]  # (last training pass, validation pass) for epochs 0 and 1
    for last_train, validation in evaluations:
        for stat in ("mean", "var"):
            per_rank = torch.tensor([rank0["train"][last_train]["bn"][stat], rank1["train"][last_train]["bn"][stat]])
            assert not torch.allclose(per_rank[0], per_rank[1])  # the shards really gave different statistics
            used = [torch.tensor(rank["eval"][validation]["bn"][stat]) for rank in (rank0, rank1)]
            torch.testing.assert_close(used[0], per_rank.mean(dim=0), rtol=1e-6, atol=1e-7)
            assert torch.equal(used[0], used[1])
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    torch.testing.assert_close(checkpoint["body.1.running_mean"], torch.tensor(rank0["eval"][1]["bn"]["mean"]))
    torch.testing.assert_close(checkpoint["body.1.running_var"], torch.tensor(rank0["eval"][1]["bn"]["var"]))


# The two-rank runs below split these updates of 64 samples (2 epochs of 19, each step's loss logged): into 2 x 32,
# or 2 ranks x 2 micro-batches of 16 (an epoch's short tail left out: there micro-batches of unequal size weigh
# differently). Both compare with the one run of one process, `big_batch_run`.
BIG_BATCH = [*QUICK, *NO_NORM_MODEL, "trainer.log_every_n_steps=1", "regularization.early_stopping.enabled=false"]
BIG_BATCH_UPDATES = 19


@pytest.fixture(scope="module")
def big_batch_run(tmp_path_factory) -> Path:
    """The run directory of one process training BIG_BATCH in batches of 64: in this process, a reference whose
    own process the tests do not look at."""
    run_dir = tmp_path_factory.mktemp("big_batch") / "single"
    limit = f"trainer.limit_train_batches={BIG_BATCH_UPDATES}"
    returncode, _, stderr = run_here("train.py", f"hydra.run.dir={run_dir}", "data.batch_size=64", limit, *BIG_BATCH)
    assert returncode == 0, stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_two_processes_with_half_batches_match_one_process(tmp_path, big_batch_run):
    double = run(
        ddp_command(
            f"hydra.run.dir={tmp_path / 'ddp'}",
            "data.batch_size=32",
            f"trainer.limit_train_batches={BIG_BATCH_UPDATES}",  # 38 updates: enough for the step losses compared
            "distributed=ddp",
            *BIG_BATCH,
        )
    )
    assert double.returncode == 0, double.stderr[-3000:]
    (single_summary, single_metrics), (ddp_summary, ddp_metrics) = read_run(big_batch_run), read_run(tmp_path / "ddp")
    assert ddp_summary["world_size"] == 2 and single_summary["world_size"] == 1
    single_steps = [m["train/step_loss"] for m in single_metrics if "train/step_loss" in m]
    ddp_steps = [m["train/step_loss"] for m in ddp_metrics if "train/step_loss" in m]
    assert len(single_steps) == len(ddp_steps) > 20
    assert ddp_steps == pytest.approx(single_steps, abs=1e-4)
    for key in ("train/loss", "val/loss", "val/acc"):
        assert [m[key] for m in ddp_metrics if key in m] == pytest.approx(
            [m[key] for m in single_metrics if key in m], abs=1e-4
        )
    # The test split (359 samples) splits unevenly across 2 ranks: a padded or per-rank-mean
    # evaluation would be off by about 1/359 in accuracy.
    assert ddp_summary["test"] == pytest.approx(single_summary["test"], abs=1e-4)
    single_weights = torch.load(big_batch_run / "checkpoints/last.pt", weights_only=True)["model"]
    ddp_weights = torch.load(tmp_path / "ddp/checkpoints/last.pt", weights_only=True)["model"]
    assert single_weights.keys() == ddp_weights.keys()  # no `module.` prefix
    for name in single_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_accumulation_under_ddp_matches_the_big_batch(tmp_path, big_batch_run):
    # 2 ranks x 2 micro-steps of 16 (no_sync on the first) == 1 process x 64, over 2 epochs of 19 full updates.
    double = run(
        ddp_command(
            f"hydra.run.dir={tmp_path / 'ddp'}",
            "data.batch_size=16",
            "trainer.accumulate_grad_batches=2",
            f"trainer.limit_train_batches={2 * BIG_BATCH_UPDATES}",
            "distributed=ddp",
            *BIG_BATCH,
        )
    )
    assert double.returncode == 0, double.stderr[-3000:]
    single_weights = torch.load(big_batch_run / "checkpoints/last.pt", weights_only=True)["model"]
    ddp_weights = torch.load(tmp_path / "ddp/checkpoints/last.pt", weights_only=True)["model"]
    for name in single_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_torchrun_single_node_shares_one_run_directory(recorded_ddp_run):
    run_dirs, _ = recorded_ddp_run
    assert len(run_dirs) == 1, run_dirs  # no directory per rank
    summary, metrics = read_run(run_dirs[0])
    assert summary["world_size"] == 2
    # Rank 0 alone writes: 2 epochs + the test line, one "done" line in train.log (a tracker's run: its own tests).
    assert [m["epoch"] for m in metrics] == [0, 1, 1] and "test/acc" in metrics[-1]
    assert (run_dirs[0] / "train.log").read_text().count("done in") == 1


@pytest.mark.slow
def test_two_torchrun_agents_form_one_two_node_job(tmp_path):
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_backend=static",
                str(ROOT / "train.py"),
                *QUICK,
            ],
            cwd=tmp_path,
            env=env_with_tests_on_path(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        errors = [finish(agent, timeout=240).stderr for agent in agents]
    finally:
        end_all(agents)  # a stuck rendezvous leaves no process behind
    assert all(agent.returncode == 0 for agent in agents), errors[0][-2000:] + errors[1][-2000:]
    run_dirs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    summary, _ = read_run(run_dirs[0])
    assert (
        summary["world_size"] == 2 and summary["test"]["test/acc"] >= 0.7
    )  # about 0.8 after 2 epochs of 10 updates (global batch 128)


@pytest.mark.slow
def test_simulated_slurm_tasks_join_one_process_group(tmp_path):
    """Two tasks that only SLURM's variables tie together train as one job: each rank draws other
    batches, yet after every update both hold the same weights (their gradients were all-reduced)."""
    (tmp_path / "records").mkdir()
    recording = [
        "model._target_=models_for_tests.RecordingCNN",
        "model.widths=[16,32]",
        f"+model.record_dir={tmp_path / 'records'}",
        "trainer.limit_train_batches=3",
    ]
    job_id = str(40000 + free_port() % 10000)
    tasks = [
        subprocess.Popen(
            train_command(f"hydra.run.dir={tmp_path / 'run'}", *QUICK, *recording),
            cwd=ROOT,
            env=env_with_tests_on_path(
                SLURM_PROCID=str(rank),
                SLURM_LOCALID=str(rank),
                SLURM_NTASKS="2",
                SLURM_NTASKS_PER_NODE="2",
                SLURM_JOB_ID=job_id,
                SLURM_JOB_NODELIST="127.0.0.1",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        errors = [finish(task, timeout=240).stderr for task in tasks]
    finally:
        end_all(tasks)
    assert all(task.returncode == 0 for task in tasks), errors[0][-2000:] + errors[1][-2000:]
    summary, _ = read_run(tmp_path / "run")
    assert summary["world_size"] == 2
    rank0, rank1 = (record["train"] for record in records(tmp_path / "records"))
    assert len(rank0) == len(rank1) == 6  # 2 epochs of 3 batches, on each rank
    assert all(a["inputs"] != b["inputs"] for a, b in zip(rank0, rank1))  # each rank its own shard
    assert [a["weights"] for a in rank0] == pytest.approx([b["weights"] for b in rank1], rel=1e-6)  # one model


@pytest.mark.slow
def test_a_crashing_rank_ends_the_whole_job_quickly(tmp_path):
    overrides = [
        *QUICK,
        "model._target_=models_for_tests.CrashOnRankOne",
        "model.widths=[16,32]",
        "trainer.max_epochs=50",
    ]
    started = time.monotonic()
    result = run(ddp_command(f"hydra.run.dir={tmp_path}", *overrides), timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "simulated crash on rank 1" in result.stderr


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_the_same_epoch(tmp_path):
    # Rank 1 alone produces NaN, on the last batch of epoch 0; rank 0's own batches were all
    # finite. Both must stop after epoch 0; a rank that went on would wait in a collective alone,
    # which the short timeout turns into a failure instead of a hang.
    started = time.monotonic()
    result = run(
        ddp_command(
            f"hydra.run.dir={tmp_path}",
            "distributed=ddp",
            *QUICK,
            "model._target_=models_for_tests.NanOnRankOne",
            "model.widths=[16,32]",
            "+model.nan_at=4",
            "trainer.limit_train_batches=4",
            "trainer.max_epochs=5",
            "distributed.timeout_seconds=20",
        ),
        timeout=180,
    )
    assert result.returncode == 1, result.stderr[-3000:]  # a failure, with summary.json written
    assert "Traceback" not in workers_output(result.stderr)
    summary, metrics = read_run(tmp_path)
    assert summary["stop_reason"] == "non-finite loss" and summary["epochs"] == 1 and summary["steps"] == 4
    assert [m["epoch"] for m in metrics if "val/loss" in m] == [0] and metrics[0]["train/loss"] is None  # NaN -> null
    assert "train/loss is not finite at epoch 0" in result.stderr + result.stdout
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_early_stopping_stops_every_rank_and_the_test_uses_the_best_weights_on_every_rank(tmp_path):
    # Early stopping with a huge min_delta: epoch 0 is the best, the run stops after epoch 2. The
    # test split must be evaluated with epoch 0's weights on both ranks (rank 0 reads best.pt and
    # broadcasts it): exactly what eval.py reports of best.pt in one process, whose validation
    # split gives epoch 0's numbers if best.pt holds epoch 0's weights. (In this process: eval.py's
    # own process is tested elsewhere; the run's two-rank split is the part under test here.)
    overrides = [
        *QUICK,
        *NO_NORM_MODEL,
        "distributed=ddp",
        "scheduler=constant",
        "trainer.limit_train_batches=5",
        "optimizer.lr=0.3",
    ]
    stopped = run(
        ddp_command(
            f"hydra.run.dir={tmp_path / 'stopped'}",
            *overrides,
            "trainer.max_epochs=6",
            "regularization.early_stopping.min_delta=100",
            "regularization.early_stopping.patience=2",
            "distributed.timeout_seconds=30",
        ),
        timeout=180,
    )
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    summary, metrics = read_run(tmp_path / "stopped")
    assert summary["stop_reason"] == "early_stopping" and summary["epochs"] == 3 and summary["best"]["epoch"] == 0
    assert [m["epoch"] for m in metrics if "val/loss" in m] == [0, 1, 2]
    best = torch.load(tmp_path / "stopped/checkpoints/best.pt", weights_only=True)["model"]
    last = torch.load(tmp_path / "stopped/checkpoints/last.pt", weights_only=True)["model"]
    assert any(not torch.allclose(best[name], last[name]) for name in best)  # the last epoch's weights differ
    best_metrics = {}
    for split in ("val", "test"):
        out_dir = tmp_path / f"eval_{split}"
        returncode, _, stderr = run_here(
            "eval.py", f"checkpoint={tmp_path / 'stopped'}", f"split={split}", f"hydra.run.dir={out_dir}"
        )
        assert returncode == 0, stderr[-3000:]
        best_metrics |= json.loads((out_dir / "metrics.json").read_text())
    epoch_zero = next(m for m in metrics if "val/loss" in m)
    best_val = {key: best_metrics[key] for key in ("val/loss", "val/acc")}
    assert best_val == pytest.approx({key: epoch_zero[key] for key in best_val}, rel=1e-6)  # epoch 0's weights
    assert summary["test"] == pytest.approx({key: best_metrics[key] for key in summary["test"]}, rel=1e-6)


@pytest.mark.slow
def test_a_hanging_rank_ends_the_job_after_the_collective_timeout(tmp_path):
    # Rank 1 stops answering (no crash, so no agent notices); rank 0 waits in the gradient
    # all-reduce until distributed.timeout_seconds, fails, and the job ends with an error. Without
    # the timeout it would wait for 30 minutes (gloo's default), here until rank 1 woke up.
    timeout = 6  # 3 times the longest any rank waits for the other before the hang here (init, on a loaded machine)
    result = run(
        ddp_command(
            f"hydra.run.dir={tmp_path / 'run'}",
            "distributed=ddp",
            *QUICK,
            "model._target_=models_for_tests.HangOnRankOne",
            "model.widths=[16,32]",
            f"+model.record_dir={tmp_path}",
            "+model.hang_seconds=90",
            f"distributed.timeout_seconds={timeout}",
        ),
        timeout=240,
    )
    ended = time.time()
    assert result.returncode == 1, result.stderr[-3000:]
    waited = ended - float((tmp_path / "hang_started").read_text())
    assert timeout <= waited < timeout + 40, waited
    assert "Timed out" in result.stderr and "train.py FAILED" in result.stderr  # torchrun's report


def test_sync_batchnorm_on_cpu_is_refused_with_a_clear_error(tmp_path):
    # The config check refuses it before any process group forms: one process shows what every rank prints.
    returncode, _, stderr = run_here(
        "train.py", f"hydra.run.dir={tmp_path}", "device=cpu", "distributed=ddp", "distributed.sync_batchnorm=true"
    )
    assert returncode == 1
    assert stderr.startswith("error: distributed.sync_batchnorm: SyncBatchNorm runs on CUDA GPUs only"), stderr


# The stop-and-resume tests compare with one straight 2-rank run of these settings:
STOP_AND_RESUME = [
    *QUICK,
    *NO_NORM_MODEL,  # BatchNorm statistics are averaged at epoch ends only: a mid-epoch save holds rank 0's
    "augmentation=shift",  # every rank's RNG (its own augmentation stream) must be restored
    "scheduler=constant",  # stopping with max_steps leaves the schedule alone
    "regularization.early_stopping.enabled=false",
    "distributed=ddp",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.log_every_n_steps=2",  # the ranks agree on a stop at logging steps
]


def assert_resumed_exactly(resumed_dir: Path, straight_dir: Path) -> None:
    (straight_summary, straight_metrics), (resumed_summary, resumed_metrics) = (
        read_run(straight_dir),
        read_run(resumed_dir),
    )
    assert resumed_summary["test"] == pytest.approx(straight_summary["test"], rel=1e-6)
    last_epoch = [[m for m in metrics if "val/loss" in m][-1] for metrics in (resumed_metrics, straight_metrics)]
    assert last_epoch[0]["val/loss"] == pytest.approx(last_epoch[1]["val/loss"], rel=1e-6)
    straight_weights = torch.load(straight_dir / "checkpoints/last.pt", weights_only=True)["model"]
    resumed_weights = torch.load(resumed_dir / "checkpoints/last.pt", weights_only=True)["model"]
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_ddp_run_stopped_inside_an_epoch_resumes_exactly(tmp_path):
    # The straight run trains while the stopped one does and then resumes (neither reads the other's directory
    # before both ended): their starts overlap.
    def start(*overrides: str) -> subprocess.Popen:
        return subprocess.Popen(
            ddp_command(*overrides),
            cwd=ROOT,
            env=env_with_tests_on_path(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    straight = start(f"hydra.run.dir={tmp_path / 'straight'}", *STOP_AND_RESUME)
    try:
        stopped = start(f"hydra.run.dir={tmp_path / 'stopped'}", "trainer.max_steps=13", *STOP_AND_RESUME)
        stderr = finish(stopped, timeout=240).stderr
        assert stopped.returncode == 0, stderr[-3000:]
        checkpoint = torch.load(tmp_path / "stopped/checkpoints/last.pt", weights_only=True)
        assert (checkpoint["epoch"], checkpoint["batches_done"], len(checkpoint["rng"])) == (1, 3, 2)
        # In the stopped run's own directory, with its config; max_steps=null lifts the stop.
        resumed = start(f"resume={tmp_path / 'stopped'}", "trainer.max_steps=null")
        stderr = finish(resumed, timeout=240).stderr
        assert resumed.returncode == 0, stderr[-3000:]
    finally:
        stderr = finish(straight, timeout=240).stderr
    assert straight.returncode == 0, stderr[-3000:]
    assert_resumed_exactly(tmp_path / "stopped", tmp_path / "straight")


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start_in_own_group(command: list[str]) -> subprocess.Popen:
    """A foreground job of its own (SIGINT at its default, as in a terminal), output merged."""
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env_with_tests_on_path(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def signal_after_metrics(process: subprocess.Popen, run_dir: Path, send, lines: int = 2) -> str:
    """Wait for `lines` metrics lines, call `send(pid)`, return the whole output."""
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 240
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
                break
            time.sleep(0.01)
        send(process.pid)
        return process.communicate(timeout=240)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_ctrl_c_under_torchrun_saves_once_at_one_step_on_every_rank(tmp_path):
    # A terminal's Ctrl-C reaches torchrun and its workers; torchrun passes a SIGINT on at once,
    # which the workers take as the same Ctrl-C (not a second one that aborts). torchrun itself
    # then reports the signal in its own way; the workers' part is the checkpoint and the line.
    overrides = [o for o in STOP_AND_RESUME if not o.startswith("distributed")]
    process = start_in_own_group(ddp_command(f"hydra.run.dir={tmp_path}", *overrides))
    output = signal_after_metrics(process, tmp_path, lambda pid: os.killpg(pid, signal.SIGINT))
    assert "aborted" not in output
    [line] = [line for line in output.splitlines() if "stopped by" in line]
    assert "stopped by SIGINT" in line
    checkpoint = torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)
    metrics = metrics_lines(tmp_path)
    assert checkpoint["step"] == metrics[-1]["step"] and 0 < checkpoint["batches_done"] < 10
    assert len(checkpoint["rng"]) == 2


def test_eval_processes_honour_the_trainings_deterministic_switch(monkeypatch):
    # eval.py evaluates with the checkpoint's config: its trainer.deterministic applies there too.
    from trainkit.distributed import launch

    calls = []
    monkeypatch.setattr(launch, "set_math_modes", lambda *args: calls.append(args))
    cfg = OmegaConf.create(
        {
            "device": "cpu",
            "precision": {"tf32": False},
            "trainer": {"cudnn_benchmark": True, "deterministic": True},
            "distributed": {"backend": "auto", "timeout_seconds": 60},
        }
    )
    with launch.joined_process_group(cfg):
        pass
    assert calls[0][-1] is True


def test_every_process_starts_from_the_one_function_given_inside_its_process_group(tmp_path):
    """train.py's `train` (eval.py's `evaluate_process`) is what every process runs, one or many: start_processes
    joins the process group around it (device, math modes). Several processes that nothing started are refused in
    one line, naming torchrun."""
    from trainkit.distributed import launch

    cfg = OmegaConf.create(
        {
            "device": "cpu",
            "precision": {"tf32": False},
            "trainer": {"cudnn_benchmark": False, "deterministic": False},
            "distributed": {"name": "none", "backend": "auto", "timeout_seconds": 60, "nproc_per_node": 2},
        }
    )
    seen = []

    def train_process(cfg, run_dir, proc, device):
        seen.append((run_dir, proc.rank, proc.world_size, device))
        return "summary"

    assert launch.start_processes(cfg, tmp_path, train_process) == "summary"
    assert seen == [(tmp_path, 0, 1, torch.device("cpu"))]
    cfg.distributed.name = "ddp"
    refused = r"^distributed.name: is ddp, .* none were started .*\(torchrun --nproc_per_node=N "
    with pytest.raises(ConfigError, match=refused):
        launch.refuse_unstarted_processes(cfg, tmp_path, train_process)
