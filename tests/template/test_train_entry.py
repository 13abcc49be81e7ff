"""train.py's top block says what runs before `main`, each step justified."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "train.py"


def before_main_block() -> list[str]:
    docstring = ast.get_docstring(ast.parse(TRAIN.read_text(encoding="utf-8"))) or ""
    assert "Before `main` runs:" in docstring, "train.py's docstring no longer says what runs before `main`"
    return docstring.split("Before `main` runs:", 1)[1].strip().splitlines()


def test_the_docstring_says_in_one_block_what_runs_before_main_and_why():
    block = before_main_block()
    assert len(block) <= 8, "the block before `main` is no longer short"
    items = " ".join(block).split("- ")[1:]
    said = {
        name: next((item for item in items if name in item), "")
        for name in ("`startup.install()`", "sys.argv", "`--help`", "`gc.freeze()`")
    }
    assert all(said.values()), f"the block leaves out {[name for name, item in said.items() if not item]}"
    assert "because" in said["sys.argv"] and "resume=" in said["sys.argv"] and "torchrun" in said["sys.argv"]
    assert re.search(r"\d", said["`--help`"]), "the --help patch is justified by what it saves"
    source, cli = TRAIN.read_text(encoding="utf-8"), (ROOT / "src" / "trainkit" / "cli.py").read_text(encoding="utf-8")
    assert "startup.install()" in source and "gc.freeze()" in source and "cli.run(main)" in source
    run = cli.split("\ndef run(", 1)[1].split("\ndef ", 1)[0]
    assert "hydra_command_line(" in run and "_list_app_groups_only()" in run, "cli.run no longer does what it says"
