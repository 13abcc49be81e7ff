# shellcheck shell=bash
# trainer.micro_batch_size=auto (feature micro_batch_auto) against real CUDA out-of-memory errors: sourced by
# scripts/gpu_check.sh (its `check`, $out, $status); deleting the feature deletes this file (docs/features.md).
# One batch of 1,024 digits resized to 512x512 on the device (finetune.input_size) through the small CNN needs
# ~300 GB of activations (~0.3 GB a sample), so the whole batch, its half, ... do not fit; the search halves until a
# part fits (a few hundred samples on an 80-141 GB GPU) and trains the batch in those parts.
check micro_batch_auto_oom finetune.input_size=512 data.batch_size=1024 data.eval_batch_size=64 \
  trainer.micro_batch_size=auto trainer.max_epochs=1 trainer.limit_train_batches=1 trainer.limit_val_batches=1
if grep -q "micro_batch_size=auto: 1024 does not fit (CUDA out of memory" "$out/micro_batch_auto_oom.log" 2>/dev/null \
  && found=$(grep -o "training in micro-batches of [0-9]*" "$out/micro_batch_auto_oom.log"); then
  echo "PASS micro_batch_auto_oom_halved: a real CUDA out-of-memory error at 1024 was caught; $found"
else
  echo "FAIL micro_batch_auto_oom_halved: no caught CUDA out-of-memory error, or no size found (log: $out/micro_batch_auto_oom.log)"
  status=1
fi
