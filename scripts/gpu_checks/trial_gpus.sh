# shellcheck shell=bash
# One GPU per sweep trial (feature trial_gpus, sweep.assign_gpus): two joblib jobs at once, long enough to overlap,
# on two GPUs. Sourced by scripts/gpu_check.sh ($gpus, $out, $status); deleting the feature deletes this file.
if [ "$gpus" -ge 2 ]; then
  sweep=$out/sweep_gpus
  if python train.py -m hydra/launcher=joblib hydra.launcher.n_jobs=2 "hydra.sweep.dir=$sweep" print_config=false \
       trainer.progress_bar=false trainer.max_epochs=15 seed=1,2 >"$sweep.log" 2>&1 \
     && devices=$(python -c "import json; print(*sorted({json.load(open('$sweep/'+j+'/summary.json'))['device'] for j in '01'}))") \
     && [ "$(echo "$devices" | wc -w)" -eq 2 ]
  then echo "PASS sweep_one_gpu_per_trial: the two parallel jobs trained on $devices"
  else echo "FAIL sweep_one_gpu_per_trial: not two distinct GPUs (log: $sweep.log)"; tail -5 "$sweep.log"; status=1
  fi
else
  echo "SKIP sweep_one_gpu_per_trial: $gpus GPU visible; it needs 2 or more"
fi
