"""Hydra's submitit and joblib launchers pickle train.py's task function by value (its script is
`__main__`), with every function and global it reaches. cloudpickle also takes along each
`torch.<a>.<b>` submodule whose name parts the code mentions (`cfg.distributed` and `run.config`
made it take torch.distributed.config, which cannot be pickled): the launchers then failed at
submission."""

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest

ROOT = Path(__file__).resolve().parents[2]


# cloudpickle's look into torch.jit raises torch's deprecation warning
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:FutureWarning")
def test_train_py_main_pickles_by_value_as_the_submitit_and_joblib_launchers_need(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])
    spec = importlib.util.spec_from_file_location("train_as_a_script", ROOT / "train.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # not in sys.modules: pickled by value, as `__main__` is
    for name in ("main", "train", "build_run", "train_one_epoch"):
        assert cloudpickle.loads(cloudpickle.dumps(getattr(script, name))).__name__ == name
