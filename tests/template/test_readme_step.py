"""README's "How the loop works" names the functions a reader follows for one training step: they must stay right.

The paragraph gives a total and, per file, the functions and methods of the step by name (`train.py` (`train_step`,
...), `tasks/task.py` (`Task.step`, `.weight`, ...): a name beginning with a dot is a method of the class named
before it). Each must be defined in its file; their lines (each whole, decorators included) must add up to the total,
and the total must stay within the issue's budget: <= 300 lines in <= 4 files. Names, not line numbers: an edit
above a function (an import removed with a feature) moves no name.
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


def named_functions(paragraph: str) -> list[tuple[Path, list[str]]]:
    """(file, qualified names) for each "`path` (`name`, `.method`, ...)" in the paragraph; short paths are under
    src/trainkit/."""
    named = []
    for name, listed in re.findall(r"`([\w/.]+\.py)` \(([^)]*)\)", paragraph):
        path = ROOT / name if (ROOT / name).is_file() else ROOT / "src" / "trainkit" / name
        assert path.is_file(), f"README names {name}, which is not a file"
        names, owner = [], ""
        for function in re.findall(r"`([\w.]+)`", listed):
            if function.startswith("."):
                function = owner + function
            owner = function.rsplit(".", 1)[0] if "." in function else ""
            names.append(function)
        named.append((path, names))
    return named

    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node for node in ast.walk(tree) if isinstance(node, kinds)]


FEATURE_LINE = re.compile(r"#\s*feature:\s*[\w-]+")


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def definitions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Every function and class of a file by its qualified name (`EpochTotals.add`)."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    found = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, kinds):
                found[prefix + child.name] = child
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_named_functions_exist_and_add_up_to_the_stated_total():
    paragraph = the_paragraph()
    stated = re.search(r"is (\d+) lines\s+in (\d+) files", paragraph)
    assert stated, "README's 'How the loop works' no longer says 'is N lines in K files'"
    named = named_functions(paragraph)
    assert len(named) == int(stated.group(2)), f"README says {stated.group(2)} files and names {len(named)}"
    total = 0
    for path, names in named:
        found = definitions(path)
        for name in names:
            assert name in found, f"README names {name} in {path.relative_to(ROOT)}, which defines no such function"
            node = found[name]
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            # A feature's marked lines go with it (docs/features.md): the count stays true after any deletion.
            total += sum(not FEATURE_LINE.search(line) for line in lines_of(path)[first - 1 : node.end_lineno])
    assert total == int(stated.group(1)), f"the named functions add up to {total} lines; README says {stated.group(1)}"
    assert total <= BUDGET_LINES and len(named) <= BUDGET_FILES, f"one step costs {total} lines in {len(named)} files"
