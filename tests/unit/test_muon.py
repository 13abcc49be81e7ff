"""optimizer=muon: Muon for the hidden matrices and AdamW for the rest, as one optimizer the scaler, the schedule
and checkpoints see whole; refused where it cannot work."""

import io
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, composed
from helpers import load_script
from trainkit.config.validation import problems
from trainkit.models.gpt import GPT
from trainkit.models.small_cnn import SmallCNN
from trainkit.muon import MuonWithAdamW
from trainkit.optim import build_optimizer
from trainkit.schedules import build_scheduler

MUON = OmegaConf.load(ROOT / "conf" / "optimizer" / "muon.yaml")
WSD = OmegaConf.load(ROOT / "conf" / "scheduler" / "wsd.yaml")


def ids(tensors) -> set[int]:
    return {id(t) for t in tensors}


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)


def test_muon_takes_the_hidden_linear_weights_and_adamw_the_embeddings_head_norms_and_biases(caplog):
    model = small_gpt()
    with caplog.at_level("INFO", logger="trainkit.optim"):
        optimizer = build_optimizer(model, MUON)
    assert isinstance(optimizer, MuonWithAdamW)
    hidden = [p for name, p in model.named_parameters() if name.startswith("blocks.") and name.endswith(".weight")]
    hidden = [p for p in hidden if p.ndim == 2]  # qkv, proj, fc, proj of each block: not the norms' scales
    muon = [p for group in optimizer.muon.param_groups for p in group["params"]]
    adamw = [p for group in optimizer.adamw.param_groups for p in group["params"]]
    assert len(hidden) == 8 and ids(muon) == ids(hidden)
    assert id(model.token_embedding.weight) in ids(adamw) and id(model.position_embedding.weight) in ids(adamw)
    assert ids(muon) | ids(adamw) == ids(model.parameters()) and not ids(muon) & ids(adamw)
    assert optimizer.param_groups == [*optimizer.muon.param_groups, *optimizer.adamw.param_groups]  # the same dicts
    muon_count, adamw_count = sum(p.numel() for p in muon), sum(p.numel() for p in adamw)
    assert (
        f"optimizer: MuonWithAdamW, for-loop (optimizer.fused=auto): Muon {muon_count:,} parameters (8 tensors), "
        f"AdamW {adamw_count:,} parameters ({len(adamw)} tensors)" in caplog.text
    )


def test_the_default_cnn_has_nothing_for_muon_and_is_refused_in_one_line(run_train):
    """SmallCNN: conv kernels (4-D), BatchNorm scales and shifts, the output head: all AdamW's, so none for Muon."""
    with pytest.raises(Exception, match="optimizer: is muon, but SmallCNN has no weight matrix for Muon"):
        build_optimizer(SmallCNN(1, 10), MUON)
    run = run_train("optimizer=muon", check=False)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        "error: optimizer: is muon, but SmallCNN has no weight matrix for Muon (the weights of nn.Linear layers other "
        "than the output head; convolution kernels go to AdamW); use optimizer=adamw"
    ]
    assert not Path(run.run_dir).exists()


def train(model, optimizer, scheduler, updates: int) -> None:
    torch.manual_seed(100 + scheduler.last_epoch)  # each update's batch follows from its index
    for _ in range(updates):
        tokens = torch.randint(0, 64, (4, 8))
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()


def test_one_optimizer_steps_both_parts_follows_the_schedule_and_resumes_exactly_from_its_state_dict():
    model = small_gpt()
    optimizer = build_optimizer(model, MUON)
    scheduler = build_scheduler(optimizer, WSD, updates_per_epoch=4, total_updates=12)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train(model, optimizer, scheduler, 5)
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters())  # both parts moved
    assert {group["lr"] for group in optimizer.param_groups} == {scheduler.get_last_lr()[0]}  # every group
    buffer = io.BytesIO()  # as a checkpoint holds it: weights_only
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
               buffer)  # fmt: skip
    train(model, optimizer, scheduler, 7)

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = small_gpt()
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = build_optimizer(resumed, MUON)
    resumed_scheduler = build_scheduler(resumed_optimizer, WSD, updates_per_epoch=4, total_updates=12)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    resumed_scheduler.load_state_dict(saved["scheduler"])
    assert (
        resumed_optimizer.muon.state is resumed_optimizer.state
        and resumed_optimizer.adamw.state is resumed_optimizer.state
    )
    train(resumed, resumed_optimizer, resumed_scheduler, 7)
    for name, p in model.named_parameters():
        assert torch.equal(dict(resumed.named_parameters())[name], p), name


def test_the_grad_scaler_unscales_both_parts():
    model = small_gpt()
    optimizer = build_optimizer(model, MUON)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    tokens = torch.randint(0, 64, (4, 8))
    torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    plain = {id(p): p.grad.clone() for p in model.parameters()}
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    for p in model.parameters():
        torch.testing.assert_close(p.grad, plain[id(p)])


FSDP = ("optimizer=muon", "distributed=fsdp", "distributed.nproc_per_node=2")


def test_muon_is_refused_under_fsdp_and_on_a_torch_without_it(monkeypatch):
    assert problems(composed(*FSDP)) == {
        "optimizer": "is muon, which orthogonalizes whole matrices, but distributed=fsdp shards them; use "
        "distributed=ddp or optimizer=adamw"
    }
    assert problems(composed("optimizer=muon", "distributed=ddp", "distributed.nproc_per_node=2")) == {}
    monkeypatch.delattr(torch.optim, "Muon")
    assert problems(composed("optimizer=muon"))["optimizer"].startswith(
        "is muon, which needs torch >= 2.9 (torch.optim.Muon), not "
    )


def test_the_muon_against_adamw_script_runs_configs_that_validate(capsys, tmp_path):
    """scripts/muon_vs_adamw.py --dry-run: each run it would start composes and passes the config check."""
    load_script("muon_vs_adamw").main(["--dry-run", "--out", str(tmp_path)])
    commands = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [command[1] for command in commands] == ["train.py"] * 4 + ["scripts/compare_runs.py"]
    for command in commands[:4]:
        overrides = [o for o in command[3:] if not o.startswith("hydra.")]
        chosen = [o.split(",")[0].replace("<best>", "3e-3") for o in overrides]  # a sweep's first value
        assert problems(composed(*chosen)) == {}, chosen


def test_the_speed_comparison_alternates_the_optimizers_on_configs_that_validate(capsys, tmp_path):
    """--speed: adamw, muon, adamw, muon, each a short run of experiment=stdlib_gpt that passes the config check."""
    load_script("muon_vs_adamw").main(["--speed", "40", "--dry-run", "--out", str(tmp_path)])
    commands = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [command[3] for command in commands] == ["optimizer=adamw", "optimizer=muon"] * 2
    for command in commands:
        assert "trainer.limit_train_batches=40" in command
        assert problems(composed(*[o for o in command[2:] if not o.startswith("hydra.")])) == {}
