# shellcheck shell=bash
# An epoch of experiment=cifar10_speedrun next to airbench94's loop on the same CIFAR-shaped data (goal: <= 1.3x),
# sourced by scripts/gpu_check.sh (its $status). Features speedrun and downloads: dropping either deletes this file.
if python -c "import airbench" >/dev/null 2>&1; then
  python scripts/speedrun_vs_airbench.py --epochs 3 || { echo "FAIL speedrun_vs_airbench"; status=1; }
else
  echo "SKIP speedrun_vs_airbench: the airbench package is not installed (pip install airbench==0.1.8)"
fi
