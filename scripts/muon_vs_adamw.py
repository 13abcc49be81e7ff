"""Muon against AdamW on experiment=stdlib_gpt at equal updates (the experiment's 4 epochs of 100 updates), each at
the best LR of a small sweep, over 3 seeds: the table of docs/speed.md.

    python scripts/muon_vs_adamw.py                      # about 2 x (4 + 3) runs of experiment=stdlib_gpt
    python scripts/muon_vs_adamw.py --out outputs/muon --lrs 1e-3,3e-3,1e-2 --dry-run   # the commands only
    python scripts/muon_vs_adamw.py --speed 40           # tokens/s only: 40 updates of each, twice, in turn

For each optimizer: one seed at each LR of --lrs (a Hydra multirun), the LR of the lowest best val/bpb kept, then
--seeds seeds at that LR. It prints scripts/compare_runs.py's table of the two settings (val/bpb with 95%
intervals, ranked) and each setting's training tokens/s (the mean over seeds of the last epoch's
train/tokens_per_sec). Extra arguments after `--` go to every run (e.g. `-- trainer.max_epochs=8`). Runs that share a
busy machine measure its load as much as their speed: `--speed` compares the two side by side instead.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("adamw", "muon")


def run(command: list[str], dry_run: bool) -> None:
    print(" ".join(command), flush=True)
    if not dry_run:
        subprocess.run(command, cwd=ROOT, check=True)


def train(sweep_dir: Path, overrides: list[str], dry_run: bool) -> None:
    run(
        [sys.executable, "train.py", "-m", "experiment=stdlib_gpt", *overrides, f"hydra.sweep.dir={sweep_dir}"], dry_run
    )


def runs_below(folder: Path) -> list[Path]:
    return sorted(path.parent for path in folder.rglob("summary.json"))


def best_lr(sweep_dir: Path) -> float:
    """The LR of the run with the lowest best val/bpb below `sweep_dir`."""
    from omegaconf import OmegaConf

    scored = []
    for run_dir in runs_below(sweep_dir):
        summary = json.loads((run_dir / "summary.json").read_text())
        scored.append(
            (summary["best"]["val/bpb"], float(OmegaConf.load(run_dir / ".hydra" / "config.yaml").optimizer.lr))
        )
    return min(scored)[1]


def tokens_per_second(seeds_dir: Path) -> float:
    last = []
    for run_dir in runs_below(seeds_dir):
        epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        last.append([m for m in epochs if "train/tokens_per_sec" in m][-1]["train/tokens_per_sec"])
    return statistics.mean(last)


def compare_speed(out: Path, updates: int, extra: list[str], dry_run: bool) -> None:
    """Each optimizer trains `updates` updates of one epoch, twice, in turn (adamw, muon, adamw, muon), so both see
    the same machine; prints each run's training tokens/s."""
    for turn in (1, 2):
        for optimizer in OPTIMIZERS:
            run_dir = out / "speed" / f"{optimizer}{turn}"
            limits = [f"trainer.limit_train_batches={updates}", "trainer.limit_val_batches=2", "trainer.max_epochs=1"]
            overrides = ["experiment=stdlib_gpt", f"optimizer={optimizer}", *limits, "print_config=false", *extra]
            run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], dry_run)
            if not dry_run:
                print(f"{optimizer}: {tokens_per_second(run_dir):,.0f} training tokens/s ({updates} updates)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "muon_vs_adamw", help="where the runs go")
    parser.add_argument("--lrs", default="1e-3,3e-3,1e-2,3e-2", help="the LRs each optimizer is swept over")
    parser.add_argument("--seeds", default="0,1,2", help="the seeds of each optimizer's best LR")
    parser.add_argument("--speed", type=int, metavar="UPDATES", help="only compare tokens/s, over UPDATES updates")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("extra", nargs="*", help="overrides for every run, after --")
    args = parser.parse_args(argv)
    if args.speed:
        compare_speed(args.out, args.speed, args.extra, args.dry_run)
        return 0
    for optimizer in OPTIMIZERS:
        sweep = args.out / optimizer / "lr_sweep"
        train(sweep, [f"optimizer={optimizer}", f"optimizer.lr={args.lrs}", "seed=0", *args.extra], args.dry_run)
        lr = "<best>" if args.dry_run else f"{best_lr(sweep):g}"
        seeds = args.out / optimizer / "seeds"
        train(seeds, [f"optimizer={optimizer}", f"optimizer.lr={lr}", f"seed={args.seeds}", *args.extra], args.dry_run)
    settings = [str(args.out / optimizer / "seeds") for optimizer in OPTIMIZERS]
    compare = [sys.executable, "scripts/compare_runs.py", *settings, "--metric", "val/bpb"]
    run([*compare, "--out", str(args.out / "compare")], args.dry_run)
    if not args.dry_run:
        for optimizer in OPTIMIZERS:
            print(f"{optimizer}: {tokens_per_second(args.out / optimizer / 'seeds'):,.0f} training tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
