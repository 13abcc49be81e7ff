"""README's "How the loop works" names the lines a reader follows for one training step: they must stay right.

The paragraph gives a total and, per file, a line range. Each range must start where a function or class starts and
end where one ends (so an edit that moves code makes this test name the range to fix), the ranges must add up to the
total, and the total must stay within the issue's budget: <= 300 lines in <= 4 files.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BUDGET_LINES, BUDGET_FILES = 300, 4


def the_paragraph() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## How the loop works", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def named_ranges(paragraph: str) -> list[tuple[Path, int, int]]:
    """(file, first line, last line) for each "`path` A-B" in the paragraph; short paths are under src/trainkit/."""
    ranges = []
    for name, first, last in re.findall(r"`([\w/.]+\.py)` (\d+)-(\d+)", paragraph):
        path = ROOT / name if (ROOT / name).is_file() else ROOT / "src" / "trainkit" / name
        assert path.is_file(), f"README names {name}, which is not a file"
        ranges.append((path, int(first), int(last)))
    return ranges


def definitions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node for node in ast.walk(tree) if isinstance(node, kinds)]


def test_the_named_lines_are_whole_definitions_and_add_up_to_the_stated_total():
    paragraph = the_paragraph()
    stated = re.search(r"is (\d+) lines\s+in (\d+) files", paragraph)
    assert stated, "README's 'How the loop works' no longer says 'is N lines in K files'"
    ranges = named_ranges(paragraph)
    assert len(ranges) == int(stated.group(2)), f"README says {stated.group(2)} files and names {len(ranges)}"
    for path, first, last in ranges:
        nodes = definitions(path)
        starts = {min([node.lineno, *(d.lineno for d in node.decorator_list)]) for node in nodes}
        ends = {node.end_lineno for node in nodes}
        where = f"README's range {path.relative_to(ROOT)} {first}-{last}"
        assert first in starts, f"{where}: line {first} starts no function or class; update the README"
        assert last in ends, f"{where}: line {last} ends no function or class; update the README"
    total = sum(last - first + 1 for _, first, last in ranges)
    assert total == int(stated.group(1)), f"the ranges add up to {total} lines; README says {stated.group(1)}"
    assert total <= BUDGET_LINES and len(ranges) <= BUDGET_FILES, f"one step costs {total} lines in {len(ranges)} files"
