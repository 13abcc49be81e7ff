"""`python train.py --help`, a config error and the default run import no heavy library.

torchvision, timm, wandb, optuna, matplotlib, scikit-learn (with scipy), tensorboard and mlflow each take a second
or more to import; they are imported inside the functions that use them (the default digits are
read from scikit-learn's file without importing it), so these three paths cost little more than
torch and Hydra. One process runs all three in turn (train.py's main, as `python train.py` calls it)
and lists the heavy modules loaded after each: what one path imports stays loaded, so each list
covers the paths before it too. Each also finds what train.py's imports made frozen out of the garbage
collector (gc.freeze), which no collection then walks again.
"""

import json
import subprocess
import sys

from conftest import ROOT

HEAVY = ("torchvision", "timm", "wandb", "optuna", "matplotlib", "sklearn", "scipy", "tensorboard", "mlflow")
HEAVY += ("transformers", "safetensors")  # model=hf and eval.py's export=: imported where a run builds or writes one
# distributed=fsdp's torch modules (~1 s): not on --help or a config error (a run's training step imports
# torch._dynamo, which imports torch.distributed.fsdp itself)
HEAVY_SUBMODULES = ("torch.distributed.fsdp", "torch.distributed.checkpoint")
PROBE = """
import gc, json, os, runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra

lookups, get_group_options = [], ConfigLoaderImpl.get_group_options
def counted(self, *args, **kwargs):
    lookups.append(args)
    return get_group_options(self, *args, **kwargs)
ConfigLoaderImpl.get_group_options = counted

heavy, results = set(sys.argv[1].split(",")), {}
paths = {
    "help": ["--help"],
    "config_error": ["optimizer.lr=-1", f"hydra.run.dir={sys.argv[2]}/error"],
    "default_run": ["debug=fast", f"hydra.run.dir={sys.argv[2]}/run"],
}
for name, args in paths.items():
    os.environ.pop("HYDRA_FULL_ERROR", None)  # cli.run sets it during its own run
    sys.argv = ["train.py", *args]
    try:
        runpy.run_path("train.py", run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    GlobalHydra.instance().clear()
    results[name] = {"exit": code, "heavy": sorted(({m.split(".")[0] for m in sys.modules} | set(sys.modules)) & heavy)}
    results[name]["group_lookups"], lookups[:] = len(lookups), []
    results[name]["frozen"] = gc.get_freeze_count()
print(json.dumps(results))
"""


def test_help_a_config_error_and_the_default_run_import_no_heavy_library(tmp_path):
    command = [sys.executable, "-c", PROBE, ",".join(HEAVY + HEAVY_SUBMODULES), str(tmp_path)]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    results = json.loads(process.stdout.strip().splitlines()[-1])
    # --help lists the app's config groups alone: Hydra's listing of its own ~20 groups as well
    # (not shown by conf/hydra/help/trainkit.yaml) took 116 look-ups, about half a second; now 26
    assert results["help"].pop("group_lookups") < 60, results
    # train.py freezes what its imports made out of the garbage collector, and a run what it built (torch._dynamo,
    # which the math modes import, ~150k more): every full collection, and those at exit, walked them all again
    # (about 0.8 s of the default run's ~8.5 s of CPU)
    frozen = {name: result.pop("frozen") for name, result in results.items()}
    assert frozen["help"] > 100_000 and frozen["default_run"] > frozen["config_error"] + 100_000, frozen
    assert {name: {"exit": result["exit"], "heavy": result["heavy"]} for name, result in results.items()} == {
        "help": {"exit": 0, "heavy": []},
        "config_error": {"exit": 1, "heavy": []},
        "default_run": {"exit": 0, "heavy": [m for m in results["default_run"]["heavy"] if m in HEAVY_SUBMODULES]},
    }, results
    assert "error: optimizer.lr: must be a number > 0, got -1" in process.stderr
    assert (tmp_path / "run" / "summary.json").exists()  # the default run really ran
