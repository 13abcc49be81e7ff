# shellcheck shell=bash
# The batch-size finder (feature batch_size_finder) against real CUDA memory: sourced by scripts/gpu_check.sh,
# whose `check` trains one run and prints PASS/FAIL; deleting the feature deletes this file (docs/features.md).
check batch_size_finder batch_size_finder.enabled=true batch_size_finder.max_batch_size=1024 trainer.max_epochs=2
