"""trainkit.startup: the stop signals while train.py imports torch and Hydra, before the run's handlers listen.
In subprocesses: the handlers are installed only when the program calls startup.install(), never by an import."""

import ast
import signal
import subprocess
import sys

from conftest import ROOT, run_here
from trainkit import startup
from trainkit.checkpointing import signals

PROGRAM = """
import os, signal, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
from trainkit import startup
startup.install()
print(signal.getsignal(signal.SIGINT) is startup._record, signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C passed on by torchrun's agent: one request
print(startup.take_over(), signal.getsignal(signal.SIGINT) is signal.default_int_handler, startup.take_over())
"""

SECOND = """
import os, signal, time
from trainkit import startup
startup.install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(1.5)
os.kill(os.getpid(), signal.SIGINT)  # an impatient second signal: out at once
time.sleep(30)
"""


def run(program: str) -> subprocess.CompletedProcess:
    # SIGINT as a terminal leaves it: a shell's background job (a CI script run with `&`) starts its children
    # with SIGINT ignored, and startup rightly leaves an ignored signal ignored.
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_it_knows_the_same_stop_signals_and_exit_code_as_the_run():
    assert startup.STOP_SIGNALS == signals.STOP_SIGNALS and startup.EXIT_STOPPED == signals.EXIT_STOPPED
    assert startup.SAME_CTRL_C_SECONDS == signals.SAME_CTRL_C_SECONDS


def test_a_signal_while_starting_is_kept_for_the_run_and_an_ignored_one_stays_ignored():
    result = run(PROGRAM)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "SIGINT", "True", "None"]


def test_a_second_signal_while_starting_ends_the_process_at_once_in_one_line():
    result = run(SECOND)
    assert result.returncode == startup.EXIT_STOPPED
    assert result.stderr.strip() == (
        "stopped by SIGTERM while starting, before training: nothing trained or saved (exit code 75); "
        "start again with the same command"
    )


def test_a_module_that_imports_it_for_its_functions_keeps_its_own_handlers():
    assert signal.getsignal(signal.SIGINT) is not startup._record  # imported by this test module, not a program


def test_a_run_in_this_process_leaves_the_handlers_it_found_not_the_recorders(tmp_path):
    """The run's handlers take over from startup's recorders and put back what was there before them: a second run
    (or a module-scoped fixture's) would otherwise start with this process's Ctrl-C recorded and kept."""
    found = {signum: signal.getsignal(signum) for signum in startup.STOP_SIGNALS}
    code, _, stderr = run_here("train.py", f"hydra.run.dir={tmp_path / 'run'}", "debug=fast", "logger=none")
    assert code == 0, stderr
    assert {signum: signal.getsignal(signum) for signum in startup.STOP_SIGNALS} == found


IMPORT_ONLY = """
import signal
from trainkit import startup  # as the program itself (__main__) would import it
print(signal.getsignal(signal.SIGINT) is startup._record)
startup.install()
print(signal.getsignal(signal.SIGINT) is startup._record)
"""


def test_importing_installs_nothing_the_program_calls_install():
    result = run(IMPORT_ONLY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_train_py_installs_the_handlers_in_its_first_lines_before_any_other_import():
    """What train.py runs first, in the open: the stdlib-only import, then the call under `__main__` (the DDP
    workers and tests that import train.py for its functions skip it), then torch and the rest."""
    first, second, third = ast.parse((ROOT / "train.py").read_text()).body[1:4]  # after the docstring
    assert ast.unparse(first) == "from trainkit import startup"
    assert ast.unparse(second) == "if __name__ == '__main__':\n    startup.install()"
    assert isinstance(third, (ast.Import, ast.ImportFrom))
