"""Issue 43's plain prose: the comments and docstrings of train.py, tasks/ and data/, and the README's walkthrough,
at most half of what they were, in ordinary English ("one label per sample", never "one label a sample")."""

import re
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
# Issue 43's counts by scripts/prose_lines.py, and the README's walkthrough (prose lines, see below), before it.
PROSE_BEFORE = {"src/trainkit/tasks": 278, "src/trainkit/data": 1019}  # at 8ef50af, markers apart
PROSE_BEFORE_IN_TRAIN_PY = 104
WALKTHROUGH_BEFORE = 56
CLIPPED = re.compile(
    r"\b(?:(?:one|a|an)(?: \w+)? (?:label|class|loss|number|target|sample|token|file|row|bin|lookup|score|scores|"
    r"prototype|statistic|value|mask|text|line|batch|collective|sequences|batches)|one) (?:a|an) (?:sample|pixel|"
    r"batch|image|row|item|token|file|class|rank|process|epoch|weighed unit|real token|text|channel|step|sequence|"
    r"part|call)\b"
)


def walkthrough(code_blocks: bool = False) -> list[str]:
    """The README's non-blank lines from "## Layout" up to "## Config groups", outside its code blocks unless asked."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    part = text[text.index("## Layout\n") : text.index("## Config groups\n")]
    if not code_blocks:
        part = re.sub(r"^```.*?^```$", "", part, flags=re.M | re.S)
    return [line for line in part.splitlines() if line.strip()]


def test_tasks_and_data_prose_is_halved():
    prose_under = load_script("prose_lines").prose_under
    for folder, before in PROSE_BEFORE.items():
        counts = prose_under(ROOT / folder)
        assert counts.comments + counts.docstrings + counts.inline_comments <= before // 2, folder


def test_train_py_has_at_most_half_the_prose_it_had():
    prose = load_script("prose_lines").prose_of((ROOT / "train.py").read_text(encoding="utf-8"))
    lines = prose.comments + prose.docstrings + prose.inline_comments
    assert lines <= PROSE_BEFORE_IN_TRAIN_PY // 2, f"train.py has {lines} lines of prose"


def test_readme_walkthrough_is_halved():
    assert len(walkthrough()) <= WALKTHROUGH_BEFORE // 2


def test_no_clipped_english_in_tasks_data_and_walkthrough():
    lines = [f"README.md: {line}" for line in walkthrough(code_blocks=True)]
    for folder in PROSE_BEFORE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines += [f"{path.relative_to(ROOT)}: {line}" for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line for line in lines if CLIPPED.search(line)] == []
