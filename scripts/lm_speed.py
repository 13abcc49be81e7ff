"""The template's train.py against a bare nanoGPT-style loop: the same GPT on the same blocks, alternated.

    python scripts/lm_speed.py                          # ~3-4 minutes on 2 CPU cores: 2 rounds of 60 updates each
    python scripts/lm_speed.py --updates 400 --rounds 3 # longer, steadier
    python scripts/lm_speed.py --device cuda --batch-size 64 --n-layer 6 --n-embd 384 --precision bf16

Each round trains twice from the same seed: once with a hand-written loop (the model class and the blocks of
data=text are the template's, the loop is not: AdamW with betas 0.9/0.95, weight decay 0.1 on the matrices,
warmup and cosine per update, clipping at 1.0, a seeded shuffle of the blocks), once with `python train.py
experiment=stdlib_gpt` in a subprocess, with the same sizes and recipe. Each run trains two "epochs" of
updates / 2 and its steady-state tokens/s is that of the second (the first holds the warm-up of caches,
allocator and threads). Then the same validation blocks are scored: val/bpb after the same number of updates.
Prints the median tokens/s of each, their ratio (the template's goal: within 1.05x of the bare loop) and both
val/bpb (goal: within 0.02; the two shuffles differ, so the figures differ by the noise of the data order).
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainkit.data.text_blocks import TextBlocks  # noqa: E402  the same blocks as data=text
from trainkit.models.gpt import GPT  # noqa: E402  the same model as model=gpt


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=60, help="updates a run (two epochs of half each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--val-batches", type=int, default=8, help="validation batches of 128 blocks")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true")
    return parser.parse_args()


def blocks(args: argparse.Namespace) -> tuple:
    """data=text's train and val blocks (the stdlib; test files few: the template tests them at its end)."""
    options = OmegaConf.load(ROOT / "conf" / "data" / "text.yaml")  # data=text as train.py reads it
    options.merge_with({"batch_size": args.batch_size, "block_size": args.block_size, "test_fraction": 0.01})
    data = TextBlocks(**{key: value for key, value in OmegaConf.to_container(options).items() if key != "_target_"})
    splits = data.splits()
    return splits.train, splits.val


def learning_rate(update: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = (update - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def bare_loop(args: argparse.Namespace, train: tuple, val: tuple) -> tuple[float, float]:
    """nanoGPT's loop, written out: (steady-state tokens/s, val/bpb)."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT(256, args.block_size, args.n_layer, args.n_head, args.n_embd, 0.0).to(device)
    matrices = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    others = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    step_model = torch.compile(model) if args.compile else model
    inputs, targets = train[0].to(device), train[1].to(device)
    half, warmup = args.updates // 2, max(1, round(0.2 * args.updates / 2))
    generator, update, seconds = torch.Generator().manual_seed(0), 0, 0.0
    for _ in range(2):  # two epochs of `half` updates: the second is timed
        order = torch.randperm(len(inputs), generator=generator).to(device)
        started = time.perf_counter()
        for batch in order.split(args.batch_size)[:half]:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(update, 2 * half, args.lr, warmup)
            x, y = inputs.index_select(0, batch).long(), targets.index_select(0, batch).long()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                logits = step_model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            update += 1
        loss.item()  # waits for the device
        seconds = time.perf_counter() - started  # the second epoch's, in the end
    tokens = half * args.batch_size * args.block_size
    return tokens / seconds, validation_bpb(model, val, args)


@torch.no_grad()
def validation_bpb(model: torch.nn.Module, val: tuple, args: argparse.Namespace) -> float:
    model.eval()
    nats, count = 0.0, 0
    limit = args.val_batches * 128
    for x, y in zip(val[0][:limit].split(128), val[1][:limit].split(128), strict=True):
        x, y = x.to(args.device).long(), y.to(args.device).long()
        with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(x)
        nats += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    return nats / count / math.log(2)


def template(args: argparse.Namespace) -> tuple[float, float]:
    """`python train.py experiment=stdlib_gpt` with the same sizes: (the second epoch's tokens/s, val/bpb)."""
    with tempfile.TemporaryDirectory() as run_dir:
        half = args.updates // 2
        command = [
            sys.executable, str(ROOT / "train.py"), "experiment=stdlib_gpt", f"hydra.run.dir={run_dir}",
            "print_config=false", "trainer.progress_bar=false", f"device={args.device}",
            f"data.batch_size={args.batch_size}", f"data.block_size={args.block_size}", "data.test_fraction=0.01",
            f"model.n_layer={args.n_layer}", f"model.n_head={args.n_head}", f"model.n_embd={args.n_embd}",
            f"optimizer.lr={args.lr}", "trainer.max_epochs=2", f"trainer.limit_train_batches={half}",
            f"trainer.limit_val_batches={args.val_batches}", "data.eval_batch_size=128", f"precision={args.precision}",
            f"trainer.compile={str(args.compile).lower()}", "trainer.log_every_n_steps=1000",
            "regularization.early_stopping.enabled=false",
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
        epochs = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        epochs = [m for m in epochs if "val/bpb" in m]
        return epochs[-1]["train/tokens_per_sec"], epochs[-1]["val/bpb"]


def main() -> None:
    args = arguments()
    train, val = blocks(args)
    print(f"{len(train[0]):,} training blocks of {args.block_size} bytes; {args.updates} updates of "
          f"{args.batch_size} blocks a run, {args.rounds} rounds, on {args.device}")  # fmt: skip
    results: dict[str, list[tuple[float, float]]] = {"bare": [], "template": []}
    for round_number in range(args.rounds):
        for name, run in (("bare", lambda: bare_loop(args, train, val)), ("template", lambda: template(args))):
            tokens_per_sec, bpb = run()
            results[name].append((tokens_per_sec, bpb))
            print(f"round {round_number}  {name:<8}  {tokens_per_sec:,.0f} tokens/s  val/bpb {bpb:.4f}", flush=True)
    bare = statistics.median(t for t, _ in results["bare"])
    ours = statistics.median(t for t, _ in results["template"])
    bare_bpb, ours_bpb = results["bare"][-1][1], results["template"][-1][1]
    print(f"bare loop {bare:,.0f} tokens/s, template {ours:,.0f} tokens/s: the bare loop is {bare / ours:.3f}x "
          f"(goal <= 1.05)")  # fmt: skip
    print(f"val/bpb after {args.updates} updates: bare {bare_bpb:.4f}, template {ours_bpb:.4f} "
          f"(difference {abs(bare_bpb - ours_bpb):.4f}, goal <= 0.02)")  # fmt: skip


if __name__ == "__main__":
    main()
