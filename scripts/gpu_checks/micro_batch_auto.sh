# shellcheck shell=bash
# trainer.micro_batch_size=auto (feature micro_batch_auto) against real CUDA out-of-memory errors: sourced by
# scripts/gpu_check.sh (its `check`, $out, $status); deleting the feature deletes this file (docs/features.md).
# One batch of 4,096 512x512 images through the small CNN needs ~1 TB of activations (~0.3 GB a sample), so the
# whole batch, its half, ... do not fit; the search halves until a part fits (a few hundred samples on an 80-141 GB
# GPU) and trains the batch in those parts.
check micro_batch_auto_oom data=synthetic data.image_size=512 data.num_samples=4096 data.val_samples=64 \
  data.test_samples=64 data.batch_size=4096 data.eval_batch_size=64 trainer.micro_batch_size=auto \
  trainer.max_epochs=1 trainer.limit_train_batches=1
if grep -q "micro_batch_size=auto: 4096 does not fit (CUDA out of memory" "$out/micro_batch_auto_oom.log" 2>/dev/null \
  && found=$(grep -o "training in micro-batches of [0-9]*" "$out/micro_batch_auto_oom.log"); then
  echo "PASS micro_batch_auto_oom_halved: a real CUDA out-of-memory error at 4096 was caught; $found"
else
  echo "FAIL micro_batch_auto_oom_halved: no caught CUDA out-of-memory error, or no size found (log: $out/micro_batch_auto_oom.log)"
  status=1
fi
