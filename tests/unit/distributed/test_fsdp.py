"""distributed=fsdp (trainkit.distributed.fsdp) on a 2-process gloo group, through its FSDP and DDP (what train.py
calls): the same weights as DDP, gradient accumulation without a sync, clipping on the sharded gradients, the
sharded checkpoint's round trip and best.pt; and without processes: its config checks (beside its code), the blocks
it shards of a Hugging Face model, what a resume of a sharded run refuses."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from test_distributed import free_port
from test_grad_norm import _backward
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule

from conftest import ROOT, composed
from helpers import config_check_tests, needs_local_launch, sharded_checkpoint, spawn_ranks, template_has
from trainkit.checkpointing import load_weights
from trainkit.checkpointing.resume import _refuse_another_checkpoint_layout
from trainkit.config.validation import problems
from trainkit.distributed import fsdp as fsdp_module
from trainkit.distributed.fsdp import FSDP, blocks
from trainkit.distributed.parallel import DDP, Parallel, parallel_for
from trainkit.distributed.process_group import ProcessInfo
from trainkit.errors import ConfigError
from trainkit.models.small_cnn import SmallCNN

DEFAULT_BLOCKS = OmegaConf.create({"blocks": None})
CPU = torch.device("cpu")


def _config(distributed: str):
    parallel = {"fsdp": "trainkit.distributed.fsdp.FSDP"}.get(distributed)  # as conf/distributed/<name>.yaml says
    return OmegaConf.create(
        {
            "distributed": {"name": distributed, "parallel": parallel, "sync_batchnorm": False, "blocks": None},
            "precision": {"name": "fp32"},
        }
    )


def _fsdp(rank: int, precision: str = "fp32", blocks=DEFAULT_BLOCKS) -> FSDP:
    return FSDP(precision, rank == 0, blocks, world_size=2)


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    return [
        (torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator))
        for _ in range(6)
    ]


def _train(parallel: Parallel, model, optimizer, batches, accumulate: int = 2, clip: float = 0.5) -> list[bool]:
    """3 updates of 2 micro-batches, clipped; per micro-step, whether every parameter's .grad was None after it."""
    no_grads = []
    for index, (inputs, targets) in enumerate(batches):
        is_update = index % accumulate == accumulate - 1
        with parallel.gradient_sync(model, enabled=is_update):
            (torch.nn.functional.cross_entropy(model(inputs), targets) / accumulate).backward()
        no_grads.append(all(p.grad is None for p in model.parameters()))
        if is_update:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # DTensors under FSDP: the global norm
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return no_grads


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard; buffers are whole


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def _fsdp_checks(rank: int, port: int, directory, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)  # each rank its own initial weights, as train.py's seed + rank gives
        own_init = _fsdp(rank).prepare(SmallCNN(1, 10, widths=(8, 16)))
        own_init_full = get_model_state_dict(own_init, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        torch.manual_seed(0)
        bare = SmallCNN(1, 10, widths=(8, 16))
        proc = ProcessInfo(rank=rank, world_size=2)
        ddp_parallel = parallel_for(_config("ddp"), proc, CPU)  # as train.py chooses them
        fsdp_parallel = parallel_for(_config("fsdp"), proc, CPU)
        assert type(ddp_parallel) is DDP and type(fsdp_parallel) is FSDP
        ddp = ddp_parallel.wrap(ddp_parallel.prepare(copy.deepcopy(bare)))
        fsdp = fsdp_parallel.wrap(fsdp_parallel.prepare(copy.deepcopy(bare)))  # sharded in place, not wrapped
        ddp_optimizer, fsdp_optimizer = _sgd(ddp), _sgd(fsdp)
        _train(ddp_parallel, ddp, ddp_optimizer, _batches(rank))
        no_grads = _train(fsdp_parallel, fsdp, fsdp_optimizer, _batches(rank))
        full = get_model_state_dict(fsdp, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        with fsdp_parallel.full_parameters(fsdp), torch.no_grad():  # one rank evaluates a batch more: nobody waits
            for _ in range(2 + rank):
                fsdp.eval()(torch.randn(4, 1, 8, 8))
        fsdp.train()
        state = {"config": {"seed": 0}, "step": 3, "epoch": 0, "batches_done": 6, "scheduler": {}}
        checkpoints = directory / "checkpoints"
        written = fsdp_parallel.save(checkpoints, state, fsdp, fsdp_optimizer, improved=True)
        torch.manual_seed(1)  # other weights, then the checkpoint's
        restored = _fsdp(rank).prepare(SmallCNN(1, 10, widths=(8, 16)))
        restored_optimizer = _sgd(restored)
        loaded = _fsdp(rank).load(checkpoints / "last", restored, restored_optimizer, CPU)
        best = torch.load(checkpoints / "best.pt", weights_only=True) if rank == 0 else None
        torch.manual_seed(2)  # other weights again, then best.pt's: rank 0 reads it, every rank gets its shards
        tested = _fsdp(rank).prepare(SmallCNN(1, 10, widths=(8, 16)))
        _fsdp(rank).load_best(best, True, tested, None)
        tested_full = get_model_state_dict(tested, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        shards = [_local(tensor) for tensor in fsdp.state_dict().values()]
        restored_shards = [_local(tensor) for tensor in restored.state_dict().values()]
        momentum = [s["momentum_buffer"].to_local() for s in fsdp_optimizer.state_dict()["state"].values()]
        restored_momentum = [s["momentum_buffer"].to_local() for s in restored_optimizer.state_dict()["state"].values()]
        by_name = _fsdp(rank, blocks=OmegaConf.create({"blocks": ["Linear"]})).prepare(SmallCNN(1, 10, widths=(8, 16)))
        units = [name for name, module in by_name.named_modules() if isinstance(module, FSDPModule)]
        bf16_parallel = _fsdp(rank, "bf16")
        bf16 = bf16_parallel.prepare(SmallCNN(1, 10, widths=(8, 16)))
        outputs = bf16(torch.randn(4, 1, 8, 8))
        outputs.float().sum().backward()
        results[rank] = {
            "units": [name for name, module in fsdp.named_modules() if isinstance(module, FSDPModule)],
            "units_by_name": units,
            "bf16": (outputs.dtype, bf16.features[1].weight.grad.dtype, bf16_parallel.precision),
            "ddp": {name: tensor.detach().clone() for name, tensor in ddp.module.state_dict().items()},
            "fsdp_full": full,
            "own_init_full": own_init_full,
            "no_grads": no_grads,
            "weights_equal": all(torch.equal(a, b) for a, b in zip(shards, restored_shards)),
            "momentum_equal": len(momentum) > 0 and all(torch.equal(a, b) for a, b in zip(momentum, restored_momentum)),
            "loaded_step": loaded["step"],
            "written": written,
            "tested_full": tested_full,
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp_checks(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fsdp")
    results = mp.Manager().dict()
    spawn_ranks(_fsdp_checks, free_port(), directory, results)
    return directory, [results[0], results[1]]


@pytest.mark.slow
def test_fsdp_trains_the_same_weights_as_ddp(fsdp_checks):
    # 2 ranks x 3 updates of 2 micro-batches, momentum, weight decay, clipping at 0.5 (the norm is ~3):
    # the gathered FSDP weights and BatchNorm buffers (rank 0's, broadcast as DDP does) equal DDP's.
    _, (rank0, _) = fsdp_checks
    assert rank0["fsdp_full"].keys() == rank0["ddp"].keys()
    for name, tensor in rank0["ddp"].items():
        torch.testing.assert_close(rank0["fsdp_full"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_fsdp_shards_rank_0s_initial_weights_whatever_each_rank_built(fsdp_checks):
    # Each rank seeds seed + rank before building: fully_shard alone would keep each rank's own rows (half of
    # every parameter from another init). The gathered weights are the model one process builds with seed 0.
    torch.manual_seed(0)
    one_process = SmallCNN(1, 10, widths=(8, 16)).state_dict()
    gathered = fsdp_checks[1][0]["own_init_full"]  # rank 0's: rank 1's half of each parameter gathered in
    assert gathered.keys() == one_process.keys()
    for name, tensor in one_process.items():
        assert torch.equal(gathered[name], tensor), name


@pytest.mark.slow
def test_fsdp_micro_steps_that_do_not_update_do_not_reduce_gradients(fsdp_checks):
    # set_requires_gradient_sync(False): the unsharded gradients wait in the blocks; no sharded .grad yet.
    for rank in fsdp_checks[1]:
        assert rank["no_grads"] == [True, False] * 3


@pytest.mark.slow
def test_a_sharded_checkpoint_restores_weights_and_optimizer_state_bitwise(fsdp_checks):
    directory, ranks = fsdp_checks
    last = directory / "checkpoints" / "last"
    assert (last / ".metadata").is_file() and (last / "state.pt").is_file()
    assert not (directory / "checkpoints" / "last.tmp").exists()
    for rank in ranks:
        assert rank["weights_equal"] and rank["momentum_equal"] and rank["loaded_step"] == 3


@pytest.mark.slow
def test_best_pt_of_two_ranks_loads_into_one_process(fsdp_checks):
    directory, (rank0, _) = fsdp_checks
    best = torch.load(directory / "checkpoints" / "best.pt", weights_only=True)
    model = SmallCNN(1, 10, widths=(8, 16))
    load_weights(model, best["model"])  # an ordinary model: full tensors, no DTensors, no prefixes
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, rank0["fsdp_full"][name]), name


@pytest.mark.slow
def test_best_pt_read_by_rank_0_is_what_every_rank_tests(fsdp_checks):
    # load_best: rank 0's full weights scattered into other-seeded shards; gathered (from both ranks' shards, on
    # rank 0), they are the trained weights best.pt holds.
    _, ranks = fsdp_checks
    assert all(rank["written"] for rank in ranks)
    assert ranks[0]["tested_full"].keys() == ranks[0]["fsdp_full"].keys()
    for name, tensor in ranks[0]["fsdp_full"].items():
        assert torch.equal(ranks[0]["tested_full"][name], tensor), name


@pytest.mark.slow
def test_fsdp_bf16_runs_the_model_in_bf16_without_autocast_and_keeps_fp32_gradients(fsdp_checks):
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); BatchNorm's own unit stays fp32.
    for rank in fsdp_checks[1]:
        assert rank["bf16"] == (torch.bfloat16, torch.float32, "fp32")


@pytest.mark.slow
def test_distributed_blocks_names_the_modules_sharded_one_by_one(fsdp_checks):
    # null: each child of the model's top-level children that has parameters (SmallCNN's layers); then the root
    rank0 = fsdp_checks[1][0]
    assert rank0["units"] == ["", "features.0", "features.1", "features.3", "features.4", "head.3"]
    assert rank0["units_by_name"] == ["", "head.3"]  # distributed.blocks=[Linear]


def test_fsdp_in_one_process_is_refused_in_one_line_before_anything_is_sharded():
    # torchrun --nproc_per_node=1 or one SLURM task: it would train unsharded and write a last.pt that its own
    # resume (distributed=fsdp reads checkpoints/last/) refuses.
    model = SmallCNN(1, 10, widths=(8, 16))
    with pytest.raises(ConfigError, match=r"^distributed.name: fsdp in 1 process has nothing to shard with"):
        FSDP("fp32", True, DEFAULT_BLOCKS, world_size=1).prepare(model)
    assert not any(isinstance(module, FSDPModule) for module in model.modules())


# ---- its config checks, declared beside its code (conf/distributed/fsdp.yaml's _checks_) ----------------------

RULE_CASES = [
    (["distributed=fsdp", "distributed.blocks=[]"], "distributed.blocks"),
    (["distributed=fsdp", "distributed.blocks=Block"], "distributed.blocks"),
]
# fsdp shards the parameters in place: what needs whole ones (or a GradScaler) is refused; other features' settings
# among them only where the feature is there (one deleted from this copy of the template has no key, or leaves a
# value of a core key that only it took, micro_batch_size=auto: no case)
WHOLE_WEIGHTS_OF_OTHER_FEATURES = [
    "regularization.ema.enabled=true",
    "lr_finder.enabled=true",
    "batch_size_finder.enabled=true",
    "trainer.micro_batch_size=auto",
]


def taken_here(setting: str) -> bool:
    """Whether this copy of the template takes `setting` without distributed=fsdp: its key exists, and no check
    refuses its value."""
    key = setting.partition("=")[0]
    there = OmegaConf.select(composed(), key, default=KeyError) is not KeyError
    return there and key not in problems(composed(setting))


RELATION_CASES = [
    (["distributed=fsdp", "trainer.compile=true"], "trainer.compile"),
    (["distributed=fsdp", "precision=fp16"], "precision"),
    (["distributed=fsdp", "distributed.nproc_per_node=1"], "distributed.nproc_per_node"),
    *[(["distributed=fsdp", s], s.partition("=")[0]) for s in WHOLE_WEIGHTS_OF_OTHER_FEATURES if taken_here(s)],
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    fsdp_module, RULE_CASES, RELATION_CASES
)


@pytest.mark.skipif(not template_has("model/hf.yaml"), reason="this clone has no model=hf (trimmed)")
def test_fsdp_shards_a_hugging_face_models_transformer_layers():
    from hydra.utils import get_method

    create_hf_model = get_method(OmegaConf.load(ROOT / "conf" / "model" / "hf.yaml")._target_)  # model=hf's

    bert = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
    gpt2 = {"model_type": "GPT2Config", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
            "bos_token_id": None, "eos_token_id": None}  # fmt: skip
    classifier = create_hf_model("trainkit.tasks.classification.Classification", num_labels=3, config=bert)
    found = blocks(classifier, None)  # distributed.blocks=null: the model's own block_names
    assert sorted({type(block).__name__ for block in found}) == ["BertEmbeddings", "BertLayer"]
    assert sum(type(block).__name__ == "BertLayer" for block in found) == 2
    causal = OmegaConf.load(ROOT / "conf" / "task" / "language_model.yaml")._target_  # task=language_model's
    language_model = create_hf_model(causal, num_labels=256, config=gpt2)
    assert {type(block).__name__ for block in blocks(language_model, None)} == {"GPT2Block"}


# ---- a resume of a sharded run (no process group) ---------------------------------------------------------------

REST = {"scheduler": {}, "epoch": 1, "step": 6, "batches_done": 2, "config": {"seed": 0}}


def test_a_sharded_run_refuses_a_last_pt_in_one_line(tmp_path):
    resolved = OmegaConf.create({"distributed": {"name": "fsdp", "parallel": "trainkit.distributed.fsdp.FSDP"}})
    with pytest.raises(ConfigError) as error:
        _refuse_another_checkpoint_layout(tmp_path / "last.pt", {"config": {"distributed": {"name": "ddp"}}}, resolved)
    assert str(error.value).startswith("distributed: is fsdp, but distributed=ddp wrote ") and "\n" not in str(
        error.value
    )


@needs_local_launch  # the workers train.py will start: distributed.nproc_per_node
def test_another_number_of_processes_inside_an_epoch_is_refused_before_workers_start(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from trainkit.checkpointing import resume
    from trainkit.config.schema import to_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        two = ["distributed=fsdp", "distributed.nproc_per_node=2"]
        config = to_dict(compose("config", overrides=two))
        three = [*two[:1], "distributed.nproc_per_node=3"]
        run_dir = tmp_path / "run"
        last = run_dir / "checkpoints" / "last"
        composed_config = compose("config", overrides=[f"resume={last}", *three])
    GlobalHydra.instance().clear()
    (run_dir / ".hydra").mkdir(parents=True)
    # written by 2 processes inside epoch 1, after batch 2
    sharded_checkpoint(last, {**REST, "config": config, "rng": [{}, {}], "early_stopping": {}})
    with pytest.raises(ConfigError) as error:  # in the parent: the checkpoint's state.pt and the config tell
        resume.resumed_config(composed_config, run_dir, overrides=[f"resume={last}", *three])
    assert str(error.value).startswith(
        "distributed.nproc_per_node: this run has 3 processes but 2 processes wrote its checkpoint inside epoch 1 "
        "(after batch 2)"
    )


def _sharded_norms(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        parallel = _fsdp(rank)
        model = parallel.prepare(SmallCNN(1, 10, widths=(8, 16)))
        _backward(model)
        norm, clipped_norm = parallel.grad_norm(model), parallel.grad_norm(model, 0.01)
        results[rank] = {"norm": norm, "clipped_norm": clipped_norm, "after_clipping": parallel.grad_norm(model)}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes
def test_under_fsdp_the_norm_over_both_ranks_shards_is_the_one_process_norm():
    torch.manual_seed(0)
    one_process = SmallCNN(1, 10, widths=(8, 16))
    _backward(one_process)
    expected = Parallel().grad_norm(one_process)
    results = mp.Manager().dict()
    spawn_ranks(_sharded_norms, free_port(), results)
    for rank in (0, 1):
        norms = results[rank]
        assert type(norms["norm"]) is torch.Tensor  # a plain tensor, the same on every rank: not a DTensor shard
        torch.testing.assert_close(norms["norm"], expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(norms["clipped_norm"], expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(norms["after_clipping"], torch.tensor(0.01), rtol=1e-4, atol=0)
