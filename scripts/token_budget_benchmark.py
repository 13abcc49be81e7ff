"""Batches filled to a token budget against fixed batches of the same mean size: experiment=stdlib_functions twice.

    python scripts/token_budget_benchmark.py                    # ~5 minutes on 2 CPU cores: one epoch each
    python scripts/token_budget_benchmark.py --threads 1        # a shared CPU machine: one torch thread a run
    python scripts/token_budget_benchmark.py --epochs 2 --rounds 2    # ABBA: budget, fixed, fixed, budget
    python scripts/token_budget_benchmark.py --fraction 0.25    # a quarter of each epoch: a quick look, noisier
    python scripts/token_budget_benchmark.py --dry-run          # the derived batch size and both commands only
    python scripts/token_budget_benchmark.py device=cuda        # trailing train.py overrides go to both runs

What is compared. The same epochs of `python train.py experiment=stdlib_functions` (subprocesses, a temporary
run directory each, the same seed, the same data, model, optimizer and schedule), once with
data.max_tokens=--max-tokens (default: the experiment's 8192; batches of functions of similar length, up to that
many token slots, padding included, at most data.batch_size functions) and once with data.max_tokens=null and
data.batch_size fixed at the budget run's mean functions a batch. That size is derived before training, from
SizeBudgetBatches over the train split's lengths (cut at data.max_length), as train.py builds it: the train
functions / the budget's batches an epoch, rounded. So both runs train about as many batches (the same
number of updates: the warmup and cosine schedule, counted in updates, match) on the same functions; only how
they are grouped, and so how much padding they carry, differs. With --rounds 2 or more the order alternates
(ABBA) so that a change in the machine's load falls on both.

What is measured, from each run's metrics.jsonl (its epoch lines) and summary.json:
- train/tokens_per_sec: REAL tokens (inputs != the padding id, counted on the device by
  trainkit.tracking.epoch_totals.EpochTotals) per second of the training pass (from the epoch's start to its
  last step: validation, test and checkpoints at the epoch's end are not in it; with trainer.compile=true the
  compiling step is left out). Padding costs time but counts for nothing, so fixed batches that pad more
  score fewer tokens/s for the same work: the honest measure of what the budget buys. Over several epochs a
  run's figure is its real tokens / its training seconds, all epochs together (the first epoch's warm-up
  weighs on both runs alike).
- train/padding_fraction: the padded share of the token slots (batch x its longest) the model processed.
- the seconds of the training passes (samples / train/samples_per_sec, epoch by epoch, summed) and the whole
  run's wall time (summary.json: data parsing, validation, test and checkpoints included).
- test/acc (summary.json; the best epoch's weights), and the test split's majority-class accuracy from the log.
Prints one line per run, then a table of both and the goals of the issue: tokens/s budget/fixed >= 1.3x,
padding <= 10% of the tokens with the budget, the test accuracies equal within noise (printed next to the
binomial standard error of a difference of two accuracies on the test split; the seed-to-seed spread of
training adds to it, so it is a lower bound of the noise).

Threads: on a CPU shared with other jobs, torch's threads wait for each other at every operator whenever one
is descheduled, a cost by operator, not by token, that hides what padding costs (on the shared 2-core machine,
2 threads: 1.17x; 1 thread: see docs/speed.md). --threads N sets OMP_NUM_THREADS=N in both runs; without it
they inherit this process's environment.

--fraction f < 1 trains round(f x the batches) batches of each epoch in both runs (trainer.limit_train_batches):
as many updates in both; the fixed run sees exactly that many batches of its size, the budget run that many of
its shuffled batches (as many samples on average, not exactly: the line above the table prints both counts).
Prefer whole epochs for the figures you report.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

EXPERIMENT = "experiment=stdlib_functions"
RESERVED = ("data.max_tokens", "data.batch_size", "trainer.max_epochs", "trainer.limit_train_batches", "seed")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs a run (trainer.max_epochs), the same for both")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs; the order alternates (ABBA)")
    parser.add_argument("--max-tokens", type=int, default=None, help="the budget (default: the experiment's)")
    parser.add_argument("--max-batch-size", type=int, default=None, help="the budget's cap (default: data.batch_size)")
    parser.add_argument("--fraction", type=float, default=1.0, help="of each epoch, in batches, for both (0 < f <= 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of both runs (default: inherited)")
    parser.add_argument("--dry-run", action="store_true", help="derive the fixed batch size, print the commands, stop")
    parser.add_argument("overrides", nargs="*", help=f"train.py overrides for both runs (not {', '.join(RESERVED)})")
    args = parser.parse_args(argv)
    for override in args.overrides:
        if override.lstrip("+~").split("=")[0] in RESERVED:
            parser.error(f"{override}: set by the benchmark ({', '.join(RESERVED)}); use its options instead")
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction {args.fraction}: must be in (0, 1]")
    return args


@dataclass
class Plan:
    """The two runs' batching, derived before training from the train split's lengths."""

    samples: int  # functions in the train split
    max_tokens: int
    max_batch_size: int  # the budget's cap: data.batch_size of the budget run
    budget_batches: int  # the budget's batches an epoch (one process)
    fixed_batch_size: int  # the budget run's mean functions a batch, rounded
    limit: int | None  # trainer.limit_train_batches of both runs (None: whole epochs)

    @property
    def mean_batch(self) -> float:
        return self.samples / self.budget_batches

    @property
    def fixed_batches(self) -> int:
        return -(-self.samples // self.fixed_batch_size)


def plan(lengths, max_tokens: int, max_batch_size: int, fraction: float = 1.0) -> Plan:
    """The fixed batch size that matches the budget's mean batch (`lengths`: the train split's, cut)."""
    from trainkit.data.size_budget import SizeBudgetBatches

    budget_batches = len(SizeBudgetBatches(lengths, max_tokens, max_batch_size))
    fixed = max(1, round(len(lengths) / budget_batches))
    limit = None if fraction >= 1 else max(1, round(fraction * min(budget_batches, -(-len(lengths) // fixed))))
    return Plan(len(lengths), max_tokens, max_batch_size, budget_batches, fixed, limit)


def train_lengths(args: argparse.Namespace) -> tuple[object, int, int]:
    """(the train split's lengths as train.py cuts them, the budget, the budget's cap) of the composed config."""
    from hydra import compose, initialize_config_dir

    from trainkit.data import make_data

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[EXPERIMENT, *args.overrides])
    max_tokens = args.max_tokens or cfg.data.max_tokens
    max_batch_size = args.max_batch_size or cfg.data.batch_size
    if not max_tokens:
        raise SystemExit("error: the experiment sets no data.max_tokens: pass --max-tokens")
    return make_data(cfg.data).splits().train.lengths, max_tokens, max_batch_size  # type: ignore[attr-defined]


def commands(args: argparse.Namespace, the_plan: Plan, run_dir: str) -> dict[str, list[str]]:
    """train.py's command line of each run: the same but for data.max_tokens and data.batch_size."""
    shared = [
        sys.executable, str(ROOT / "train.py"), EXPERIMENT, f"hydra.run.dir={run_dir}", "print_config=false",
        "trainer.progress_bar=false", "logger=none", "regularization.early_stopping.enabled=false",
        f"seed={args.seed}", f"trainer.max_epochs={args.epochs}",
        *([f"trainer.limit_train_batches={the_plan.limit}"] if the_plan.limit else []), *args.overrides,
    ]  # fmt: skip
    return {
        "budget": [*shared, f"data.max_tokens={the_plan.max_tokens}", f"data.batch_size={the_plan.max_batch_size}"],
        "fixed": [*shared, "data.max_tokens=null", f"data.batch_size={the_plan.fixed_batch_size}"],
    }


def samples_an_epoch(lengths, the_plan: Plan, seed: int, epochs: int) -> dict[str, list[int]]:
    """The functions each run trains in each epoch (what train/samples_per_sec is over)."""
    if the_plan.limit is None:
        return {"budget": [the_plan.samples] * epochs, "fixed": [the_plan.samples] * epochs}
    from trainkit.data.size_budget import SizeBudgetBatches

    batches = SizeBudgetBatches(lengths, the_plan.max_tokens, the_plan.max_batch_size, seed=seed)
    budget = []
    for epoch in range(epochs):  # train.py: the run seed, set_epoch(epoch), the first `limit` batches
        batches.set_epoch(epoch)
        budget.append(sum(len(batch) for batch in batches.batches()[: the_plan.limit]))
    fixed = min(the_plan.samples, the_plan.limit * the_plan.fixed_batch_size)
    return {"budget": budget, "fixed": [fixed] * epochs}


@dataclass
class Result:
    name: str
    epochs: list[dict] = field(default_factory=list)  # metrics.jsonl's epoch lines
    epoch_seconds: list[float] = field(default_factory=list)  # their training passes
    train_seconds: float = 0.0  # the training passes, summed
    wall_seconds: float = 0.0  # summary.json: the whole run
    test_acc: float = math.nan
    majority: str | None = None  # the log's majority-class line

    @property
    def real_tokens(self) -> float:
        return sum(e["train/tokens_per_sec"] * s for e, s in zip(self.epochs, self.epoch_seconds, strict=True))

    @property
    def tokens_per_sec(self) -> float:
        return self.real_tokens / self.train_seconds

    @property
    def padding(self) -> float:
        per_epoch = [e["train/tokens_per_sec"] * s for e, s in zip(self.epochs, self.epoch_seconds, strict=True)]
        slots = sum(real / (1 - e["train/padding_fraction"]) for real, e in zip(per_epoch, self.epochs, strict=True))
        return 1 - sum(per_epoch) / slots


def train(name: str, command: list[str], run_dir: Path, samples: list[int], threads: int | None) -> Result:
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"error: the {name} run failed (exit {done.returncode}):\n{' '.join(command)}\n{tail}")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    result = Result(name, [m for m in lines if "train/tokens_per_sec" in m])
    result.epoch_seconds = [n / e["train/samples_per_sec"] for n, e in zip(samples, result.epochs, strict=True)]
    result.train_seconds = sum(result.epoch_seconds)
    result.wall_seconds = summary.get("wall_seconds", time.perf_counter() - started)
    result.test_acc = summary["test"]["test/acc"]
    found = re.search(r"test split: majority class .*", done.stdout + done.stderr)
    result.majority = found.group(0) if found else None
    return result


def order(rounds: int) -> list[str]:
    """budget, fixed | fixed, budget | budget, fixed ...: ABBA over two rounds."""
    return [name for r in range(rounds) for name in (("budget", "fixed") if r % 2 == 0 else ("fixed", "budget"))]


def report(results: dict[str, list[Result]], test_samples: int | None) -> None:
    print(f"\n{'run':<8} {'tokens/s':>10} {'padding':>8} {'train s':>8} {'wall s':>8} {'test/acc':>9}")
    for name in ("budget", "fixed"):
        for result in results[name]:
            print(
                f"{name:<8} {result.tokens_per_sec:>10,.0f} {result.padding:>8.1%} {result.train_seconds:>8.1f} "
                f"{result.wall_seconds:>8.1f} {result.test_acc:>9.4f}"
            )
    budget = statistics.median(r.tokens_per_sec for r in results["budget"])
    fixed = statistics.median(r.tokens_per_sec for r in results["fixed"])
    ratio = budget / fixed
    met = "met" if ratio >= 1.3 else "NOT met"
    print(f"\ntokens/s (real tokens), budget / fixed: {ratio:.2f}x  (goal >= 1.3x: {met})")
    budget_padding = max(r.padding for r in results["budget"])
    fixed_padding = statistics.median(r.padding for r in results["fixed"])
    print(f"padding: budget {budget_padding:.1%} of the token slots (goal <= 10%: "
          f"{'met' if budget_padding <= 0.10 else 'NOT met'}), fixed {fixed_padding:.1%}")  # fmt: skip
    budget_acc = statistics.median(r.test_acc for r in results["budget"])
    fixed_acc = statistics.median(r.test_acc for r in results["fixed"])
    noise = ""
    if test_samples:  # two accuracies near p on n samples: each p(1-p)/n, their difference twice that
        p = (budget_acc + fixed_acc) / 2
        error = math.sqrt(2 * p * (1 - p) / test_samples)
        noise = f"; binomial standard error of a difference on {test_samples} test functions {error:.4f}"
    print(f"test/acc: budget {budget_acc:.4f}, fixed {fixed_acc:.4f} (difference {budget_acc - fixed_acc:+.4f}{noise})")
    majority = next((r.majority for rs in results.values() for r in rs if r.majority), None)
    if majority:
        print(majority)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    lengths, max_tokens, max_batch_size = train_lengths(args)
    the_plan = plan(lengths, max_tokens, max_batch_size, args.fraction)
    samples = samples_an_epoch(lengths, the_plan, args.seed, args.epochs)
    print(
        f"{the_plan.samples:,} training functions; data.max_tokens={max_tokens} (at most {max_batch_size} a batch): "
        f"{the_plan.budget_batches} batches an epoch, {the_plan.mean_batch:.2f} functions a batch on average -> "
        f"fixed batches of data.batch_size={the_plan.fixed_batch_size} ({the_plan.fixed_batches} batches an epoch)"
    )
    if the_plan.limit:
        print(f"--fraction {args.fraction}: {the_plan.limit} batches an epoch each; functions an epoch: "
              f"budget {samples['budget']}, fixed {samples['fixed']}")  # fmt: skip
    threads = args.threads or os.environ.get("OMP_NUM_THREADS", "unset")
    runs = ", ".join(order(args.rounds))
    print(f"{args.epochs} epoch(s) a run, {args.rounds} round(s): {runs}; OMP_NUM_THREADS={threads}", flush=True)
    if args.dry_run:
        for name, command in commands(args, the_plan, "<temporary run dir>").items():
            print(f"{name}: {' '.join(command[1:])}")
        return 0
    results: dict[str, list[Result]] = {"budget": [], "fixed": []}
    test_samples = None
    for number, name in enumerate(order(args.rounds)):
        with tempfile.TemporaryDirectory() as run_dir:
            result = train(name, commands(args, the_plan, run_dir)[name], Path(run_dir), samples[name], args.threads)
        results[name].append(result)
        if result.majority and (found := re.search(r"of (\d+) texts", result.majority)):
            test_samples = int(found.group(1))
        each_epoch = ", ".join(f"{epoch['train/tokens_per_sec']:,.0f}" for epoch in result.epochs)
        print(
            f"run {number} {name:<6}  {result.tokens_per_sec:,.0f} tokens/s (epochs: {each_epoch})  "
            f"padding {result.padding:.1%}  train {result.train_seconds:.1f}s  wall {result.wall_seconds:.1f}s  "
            f"test/acc {result.test_acc:.4f}",
            flush=True,
        )
    report(results, test_samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
