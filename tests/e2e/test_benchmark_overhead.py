"""scripts/handwritten_digits.py, the bare loop scripts/benchmark_overhead.py times train.py against."""

import subprocess
import sys

import pytest

from conftest import ROOT

# The baseline run under a probe that lists, at exit, the heavy libraries it imported.
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("imported:", sorted({m.split(".")[0] for m in sys.modules} & {"sklearn", "scipy"})))
runpy.run_path("scripts/handwritten_digits.py", run_name="__main__")
"""


@pytest.mark.slow  # the whole baseline: 20 epochs on the digits, about 10 s of CPU
def test_the_bare_loop_reads_the_digits_as_train_py_does_and_trains_as_it_does():
    """It reads scikit-learn's digits file without importing scikit-learn, as train.py does: that import
    (about 1.2 s of CPU, scipy included), counted on the baseline's side alone, had made train.py's whole
    process look cheaper than the bare loop. The same digits and training give train.py's default test/acc."""
    process = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert process.returncode == 0, process.stderr[-3000:]
    result, imported = process.stdout.strip().splitlines()
    assert imported == "imported: []"
    assert result.startswith("val/acc 0.9833 test/acc 0.9944 in "), result  # train.py's: 0.9944289693593314
