#!/usr/bin/env bash
# The CUDA paths that CPU-only CI cannot run, as one short script for a machine with a GPU:
#   bash scripts/gpu_check.sh            (prints one PASS/FAIL/SKIP line per check, then the benchmarks)
# Without a CUDA GPU it stops at once with one line and exit status 1: its checks are about CUDA.
# Each train.py check is a real run on the bundled digits with a few epochs.
#
# What one GPU can and cannot check:
# - fp32/bf16/fp16 (GradScaler + clipping), channels_last + torch.compile and the optional features' own checks
#   (their tests marked `cuda`; scripts/gpu_checks/: a file per feature that has a check of its own, sourced
#   below while the feature is there): fully.
# - DDP with one process (`ddp_self_launch_1`): train.py's own launcher starting a worker that picks
#   its GPU from LOCAL_RANK. With a world size of 1 train.py creates no process group at all, so this
#   says nothing about NCCL or gradient all-reduce.
# - `nccl_1rank`: a one-rank NCCL process group on this GPU, an all_reduce and a barrier. It shows that
#   NCCL loads and forms a communicator here; it does not test any reduction across ranks, P2P or
#   NVLink/InfiniBand paths. SyncBatchNorm is converted and run forward/backward in that group, but
#   with one rank SyncBatchNorm computes plain BatchNorm: the cross-rank statistics are not tested.
# - Real cross-rank NCCL and SyncBatchNorm need 2+ GPUs: `ddp_nccl_2` and `ddp_syncbn_2` run only
#   when at least two are visible, and print SKIP otherwise, as do the features' multi-GPU checks. (The CPU tests cover the DDP loop
#   itself with gloo: tests/unit/distributed/test_distributed.py.)
# - So do `fsdp_nccl_2_bf16` (FSDP2 with bf16 MixedPrecisionPolicy over NCCL) and `fsdp_best_pt_one_process`  # feature: fsdp
#   (its best.pt in eval.py); FSDP's CPU tests: tests/unit/distributed/test_fsdp.py, tests/e2e/test_fsdp_runs.py.  # feature: fsdp
set -u
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled
out=$(mktemp -d)
status=0
check() {  # check NAME OVERRIDES...
  local name=$1; shift
  if python train.py "hydra.run.dir=$out/$name" print_config=false trainer.progress_bar=false "$@" >"$out/$name.log" 2>&1; then
    echo "PASS $name: $(python -c "import json,sys; s=json.load(open('$out/$name/summary.json')); print(f\"test/acc {s['test']['test/acc']:.4f} device {s['device']} world {s['world_size']} {s['wall_seconds']:.1f}s\")")"
  else
    echo "FAIL $name (log: $out/$name.log)"; tail -5 "$out/$name.log"; status=1
  fi
}
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
if ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "FAIL: no CUDA GPU visible (torch.cuda.is_available() is False); run this on a machine with a GPU" >&2
  exit 1
fi
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
check fp32 trainer.max_epochs=5
check bf16 precision=bf16 trainer.max_epochs=5
check fp16_scaler precision=fp16 trainer.max_epochs=5 trainer.grad_clip=1.0
check channels_last_compile trainer.channels_last=true trainer.compile=true trainer.max_epochs=3
check ddp_self_launch_1 distributed=ddp distributed.nproc_per_node=1 trainer.max_epochs=3
# trainer.deterministic: deterministic cuDNN/cuBLAS kernels (CUBLAS_WORKSPACE_CONFIG set), no autotuning, so
# two runs on this GPU give bit-identical weights; fp32 with TF32 on, as a default run has it.
check deterministic_a trainer.deterministic=true trainer.max_epochs=2
check deterministic_b trainer.deterministic=true trainer.max_epochs=2
if python -c "import sys, torch; a, b = (torch.load('$out/deterministic_'+x+'/checkpoints/last.pt', weights_only=True)['model'] for x in 'ab'); sys.exit(not all(torch.equal(a[k], b[k]) for k in a))" 2>/dev/null
then echo "PASS deterministic_identical: two trainer.deterministic=true runs give bit-identical last.pt weights"
else echo "FAIL deterministic_identical: the two trainer.deterministic=true runs' last.pt weights differ (or a run failed)"; status=1
fi

# One-rank NCCL smoke test (see the header for what it does not cover).
if python - >"$out/nccl_1rank.log" 2>&1 <<'EOF'
import socket

import torch
import torch.distributed as dist

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=device)
try:
    value = torch.ones(4, device=device)
    dist.all_reduce(value)
    dist.barrier()
    assert value.tolist() == [1.0] * 4, value
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))).to(device)
    assert isinstance(model[1], torch.nn.SyncBatchNorm)
    model(torch.randn(4, 3, 8, 8, device=device)).sum().backward()
    print("nccl", torch.cuda.nccl.version(), "one rank: init, all_reduce, barrier, SyncBatchNorm forward/backward")
finally:
    dist.destroy_process_group()
EOF
then echo "PASS nccl_1rank: $(tail -1 "$out/nccl_1rank.log") (no cross-rank reduction tested)"
else echo "FAIL nccl_1rank (log: $out/nccl_1rank.log)"; tail -5 "$out/nccl_1rank.log"; status=1
fi

if [ "$gpus" -ge 2 ]; then
  check ddp_nccl_2 distributed=ddp distributed.nproc_per_node=2 trainer.max_epochs=3
  check ddp_syncbn_2 distributed=ddp distributed.nproc_per_node=2 distributed.sync_batchnorm=true trainer.max_epochs=3
  # FSDP2 over NCCL, bf16 through MixedPrecisionPolicy: sharded checkpoints/last/, and best.pt (full weights)  # feature: fsdp
  # read back by eval.py in one process must give the run's own test/acc.  # feature: fsdp
  check fsdp_nccl_2_bf16 distributed=fsdp distributed.nproc_per_node=2 precision=bf16 trainer.max_epochs=3  # feature: fsdp
  if [ -f "$out/fsdp_nccl_2_bf16/checkpoints/last/.metadata" ] &&  # feature: fsdp
    python eval.py "checkpoint=$out/fsdp_nccl_2_bf16" "hydra.run.dir=$out/fsdp_eval" >"$out/fsdp_eval.log" 2>&1 &&  # feature: fsdp
    python -c "import json,sys; a=json.load(open('$out/fsdp_eval/metrics.json'))['test/acc']; b=json.load(open('$out/fsdp_nccl_2_bf16/summary.json'))['test']['test/acc']; sys.exit(abs(a-b)>1e-6)"  # feature: fsdp
  then echo "PASS fsdp_best_pt_one_process: eval.py on the 2-rank FSDP run's best.pt gives its test/acc"  # feature: fsdp
  else echo "FAIL fsdp_best_pt_one_process (log: $out/fsdp_eval.log)"; status=1  # feature: fsdp
  fi  # feature: fsdp
else
  echo "SKIP ddp_nccl_2, ddp_syncbn_2: $gpus GPU visible; they need 2 or more"
  echo "SKIP fsdp_nccl_2_bf16: $gpus GPU visible; it needs 2 or more"  # feature: fsdp
fi
# Each optional feature's own CUDA checks live in its test files (docs/features.md), marked `cuda`.
if python -m pytest -q -p no:cacheprovider -m cuda tests >"$out/pytest_cuda.log" 2>&1
then echo "PASS pytest_cuda: $(grep -E '[0-9]+ passed' "$out/pytest_cuda.log" | tail -1)"
else echo "FAIL pytest_cuda (log: $out/pytest_cuda.log)"; tail -5 "$out/pytest_cuda.log"; status=1
fi
# The optional features' own GPU checks (docs/features.md): scripts/gpu_checks/*.sh, each gone with the rows that list it.
for feature_check in scripts/gpu_checks/*.sh; do [ -e "$feature_check" ] && source "$feature_check"; done
python scripts/lm_speed.py --device cuda --precision bf16 --compile --updates 200 --batch-size 64 || { echo "FAIL lm_speed"; status=1; }  # feature: benchmarks
python scripts/benchmark_overhead.py --repeats 3 trainer.progress_bar=false  # feature: benchmarks
# The optimization ladder (scripts/benchmark.py): the speed-run net on 40,000 synthetic 32x32 PNGs, baseline  # feature: ladder
# file loader -> workers + pinned -> cached on the GPU -> bf16 -> channels_last -> compile -> DDP (2+ GPUs).   # feature: ladder
ladder=(--images 40000 --steps 50 --out "$out/ladder" model=speedrun data.image_size=32 data.batch_size=512)  # feature: ladder
python scripts/benchmark.py "${ladder[@]}" || { echo "FAIL benchmark ladder (logs: $out/ladder/runs)"; status=1; }  # feature: ladder
if [ "$gpus" -ge 2 ]; then python scripts/benchmark_ddp.py --nproc 2; else echo "SKIP benchmark_ddp: one GPU gives no scaling to measure"; fi  # feature: benchmarks
exit $status
