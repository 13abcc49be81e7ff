#!/usr/bin/env bash
# The CUDA paths that CPU-only CI cannot run, as one short script for a machine with a GPU:
#   bash scripts/gpu_check.sh            (prints one PASS/FAIL line per check, then the benchmarks)
# Each check is a real train.py run on the bundled digits (or synthetic data) with a few epochs.
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
check fp32 trainer.max_epochs=5
check bf16 precision=bf16 trainer.max_epochs=5
check fp16_scaler precision=fp16 trainer.max_epochs=5 trainer.grad_clip=1.0
check channels_last_compile trainer.channels_last=true trainer.compile=true trainer.max_epochs=3
check ddp_nccl_1 distributed=ddp distributed.nproc_per_node=1 trainer.max_epochs=3
check ddp_syncbn_1 distributed=ddp distributed.nproc_per_node=1 distributed.sync_batchnorm=true trainer.max_epochs=3
check timm_resnet18_synthetic data=synthetic data.image_size=64 model=timm model.name=resnet18 precision=bf16 trainer.channels_last=true trainer.max_epochs=2
check lr_and_batch_finders lr_finder.enabled=true batch_size_finder.enabled=true batch_size_finder.max_batch_size=1024 trainer.max_epochs=2
python scripts/benchmark_overhead.py --repeats 3 trainer.progress_bar=false
python scripts/benchmark_ddp.py --nproc 1
exit $status
