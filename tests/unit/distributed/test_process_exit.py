"""A rank that trained leaves with os._exit (trainkit.distributed.process_group.exit_now_if_a_process_group_was_joined):
DDP keeps its process group alive past destroy_process_group, and the group's threads running under
the C++ exit-time destructors could abort a finished rank."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT


def leave(code: str, joined: bool) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import atexit, logging, sys
        import trainkit.distributed.process_group as distributed
        atexit.register(print, "exit-time handlers ran")
        logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
        logging.getLogger("run").info("logged before leaving")
        print("printed before leaving", end="")  # no newline: flushed by the exit, not by the line buffer
        distributed._joined_a_process_group = {joined}
        distributed.exit_now_if_a_process_group_was_joined({code})
        print(" and went on")
        """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("code", "returncode"), [("75", 75), ("'bad input'", 1)])
def test_a_rank_that_joined_a_group_leaves_at_once_with_its_exit_code_and_its_output_flushed(code, returncode):
    result = leave(code, joined=True)
    assert result.returncode == returncode, result.stderr
    assert result.stdout == "logged before leaving\nprinted before leaving"  # no exit-time handler ran
    if code == "'bad input'":
        assert result.stderr.strip() == "bad input"


def test_a_process_that_never_joined_a_group_exits_normally():
    result = leave("0", joined=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("printed before leaving and went on\nexit-time handlers ran\n")


def test_the_tests_spawn_their_ranks_through_spawn_ranks_which_leaves_the_same_way():
    """A rank that mp.spawn starts exits normally once its work returns; after DDP, that exit can abort it."""
    allowed = ("helpers.py", Path(__file__).name)
    spawning = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name not in allowed and re.search(r"\.spawn\(|start_method=.spawn", path.read_text())
    ]
    assert spawning == [], f"start the ranks with helpers.spawn_ranks (or on_two_ranks) in: {', '.join(spawning)}"
