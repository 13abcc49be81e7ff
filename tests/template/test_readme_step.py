"""README's "How the loop works" states what one optimizer update runs: the test traces it and checks the numbers.

One update of the default run and of `experiment=stdlib_gpt` (CPU, the shipped config; the second update, which
logs with trainer.log_every_n_steps=2) runs under sys.settrace, from the loop's `for` line in train_one_epoch until
it comes round after the update. Every function of train.py and src/trainkit/ that runs is counted whole, from its
def to its end, as a reader reads it, without blank, comment and docstring lines; a comprehension or lambda counts
as the function it is written in. A feature's code (its files in docs/features.md, its `# feature:` lines) is
counted apart, so deleting a feature changes no stated number. The README lists the default run's functions by
file and name.

    python tests/template/test_readme_step.py    # prints both counts and the functions of each
"""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BUDGET_LINES, BUDGET_FILES = 266, 11  # today's, not to grow; issue 43 aims at 250 lines in 10 files
RUNS = {"default": [], "stdlib_gpt": ["experiment=stdlib_gpt"]}
ROWS_OF_THE_RUN = {"stdlib_gpt": ("language_model",)}  # a capability's files that a run is made of count as its own
if not (ROOT / "conf" / "experiment" / "stdlib_gpt.yaml").is_file():  # a clone trimmed of the language model
    del RUNS["stdlib_gpt"]


def script(name: str):
    """scripts/<name>.py as a module (this file also runs as a script, outside the tests' helpers)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


trim = script("trim")


class TracedEnough(BaseException):
    """Raised from the trace once the update is traced: the run ends there (no exception handler catches it)."""


def traced_run(overrides: list[str], run_dir: str) -> list[tuple[str, int, str]]:
    """(file, first line, name) of each project function that runs in the second update of `train.py <overrides>`,
    logging every 2 updates so that update logs (the first may run what happens once, such as a lazy setup)."""
    import runpy

    runpy.run_path(str(ROOT / "train.py"), run_name="imports")  # train.py's imports, untraced: seconds saved
    project = (str(ROOT / "train.py"), str(ROOT / "src" / "trainkit"))
    seen: dict[tuple[str, int, str], None] = {}
    window = {"on": False, "loop_line": 0}

    def in_the_loop(frame, event, arg):
        if event == "line" and frame.f_lineno == window["loop_line"]:
            step = frame.f_locals["state"].step
            if step == 2:
                raise TracedEnough
            window["on"] = step == 1
        return in_the_loop

    def tracer(frame, event, arg):
        code = frame.f_code
        if code.co_name == "train_one_epoch" and code.co_filename == project[0]:
            window["loop_line"] = window["loop_line"] or for_line(code.co_filename, code.co_firstlineno)
            seen.setdefault((code.co_filename, code.co_firstlineno, code.co_name), None)
            return in_the_loop
        if window["on"] and code.co_filename.startswith(project):
            seen.setdefault((code.co_filename, code.co_firstlineno, code.co_name), None)
        return None

    sys.argv = ["train.py", f"hydra.run.dir={run_dir}", "device=cpu", "trainer.log_every_n_steps=2", *overrides]
    sys.settrace(tracer)
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    except TracedEnough:
        return list(seen)
    except SystemExit as exit:
        command = " ".join(overrides)
        raise AssertionError(f"train.py {command} exited with {exit.code} before its second update") from None
    finally:
        sys.settrace(None)
    raise AssertionError(f"train.py {' '.join(overrides)} ended before its second update")


def for_line(path: str, first: int) -> int:
    """The line of the `for` loop over the batches in the function starting at `first`."""
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.lineno == first:
            return next(child.lineno for child in ast.walk(node) if isinstance(child, ast.For))
    raise AssertionError(f"no function at {path}:{first}")


def feature_files(kept: tuple[str, ...] = ()) -> set[Path]:
    """The files the features table of docs/features.md deletes, but those of the rows `kept`."""
    return {ROOT / file for row in trim.read_table(ROOT).values() if row.name not in kept for file in row.files}


def functions_of(path: Path) -> list[tuple[int, int, str, ast.AST]]:
    """(first line, last line, qualified name, node) of each function and lambda in a file, decorators included."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                if not isinstance(child, ast.ClassDef):
                    found.append((first, child.end_lineno, prefix + child.name, child))
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of the module's, its classes' and its functions' docstrings."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = [
        node.body[0]
        for node in ast.walk(tree)
        if isinstance(node, owners) and ast.get_docstring(node, False) is not None
    ]
    return {number for first in found for number in range(first.lineno, (first.end_lineno or first.lineno) + 1)}


def code_lines(path: Path) -> set[int]:
    """The lines of a file that are code: not blank, not only a comment, not a docstring, not a feature's."""
    text = path.read_text(encoding="utf-8")
    prose = docstring_lines(ast.parse(text))
    return {
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.strip().startswith("#") and number not in prose and not trim.MARKER.search(line)
    }


def counted(seen: list[tuple[str, int, str]], rows: tuple[str, ...] = ()) -> dict:
    """The traced functions, whole, by file: code lines and names, the core's (and `rows`') apart from the features'."""
    features = feature_files(rows)
    by_file: dict[Path, dict[str, set[int]]] = {}
    for filename, first, name in seen:
        path = Path(filename)
        candidates = [f for f in functions_of(path) if f[0] <= first <= f[1]]
        if name.startswith("<"):  # a comprehension or lambda: the function it is written in
            candidates = [f for f in candidates if not isinstance(f[3], ast.Lambda)]
        if not candidates:
            continue  # module-level code (an import): no function of the step
        start, end, qualified, _ = max(candidates, key=lambda f: f[0])  # the innermost
        by_file.setdefault(path, {})[qualified] = set(range(start, end + 1))
    core, feature = {}, {}
    for path, functions in sorted(by_file.items()):
        lines = set().union(*functions.values()) & code_lines(path)
        kept = feature if path in features else core
        kept[str(path.relative_to(ROOT))] = {"lines": len(lines), "functions": sorted(functions)}
    total = sum(entry["lines"] for entry in core.values())
    return {"lines": total, "files": len(core), "by_file": core, "features": feature}


def traced_counts() -> dict[str, dict]:
    """Both runs traced in one fresh interpreter (this file as a script), their counts by run name."""
    done = subprocess.run([sys.executable, __file__, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def the_paragraph() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## How the loop works", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def named_functions(paragraph: str) -> dict[str, list[str]]:
    """{file: qualified names} for each "`path` (`name`, `.method`, ...)" in the paragraph; short paths are under
    src/trainkit/. A name beginning with a dot is a method of the class named before it."""
    named = {}
    for name, listed in re.findall(r"`([\w/.]+\.py)` \(([^)]*)\)", paragraph):
        path = name if (ROOT / name).is_file() else f"src/trainkit/{name}"
        names, owner = [], ""
        for function in re.findall(r"`([\w.]+)`", listed):
            if function.startswith("."):
                function = owner + function
            owner = function.rsplit(".", 1)[0] if "." in function else ""
            names.append(function)
        named[path] = sorted(names)
    return named


def test_the_readme_states_what_one_traced_update_runs():
    counts = traced_counts()
    for run, found in counts.items():
        print(f"{run}: {found['lines']} code lines in {found['files']} files; by file: {found['by_file']}")
    paragraph = the_paragraph()
    default = counts["default"]
    stated = re.search(r"runs (\d+) code lines in (\d+) files", paragraph)
    assert stated, "README's 'How the loop works' no longer says 'runs N code lines in K files'"
    assert [int(n) for n in stated.groups()] == [default["lines"], default["files"]], "README's numbers are not traced"
    if "stdlib_gpt" in counts:
        gpt = re.search(r"`experiment=stdlib_gpt`: (\d+) in (\d+)", paragraph)
        assert gpt, "README's 'How the loop works' no longer says '`experiment=stdlib_gpt`: N in K'"
        traced = counts["stdlib_gpt"]
        assert [int(n) for n in gpt.groups()] == [traced["lines"], traced["files"]], "README's numbers are not traced"
    listed = {path: entry["functions"] for path, entry in default["by_file"].items()}
    assert named_functions(paragraph) == listed, "README's functions of the step are not the traced ones"
    assert default["lines"] <= BUDGET_LINES and default["files"] <= BUDGET_FILES, "one update runs more than it did"


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(ROOT / "src"))  # this clone's package, whichever one is installed
    as_json, results = "--json" in sys.argv, {}  # the runs rewrite sys.argv
    with tempfile.TemporaryDirectory() as directory:
        for name, overrides in RUNS.items():
            results[name] = counted(traced_run(overrides, f"{directory}/{name}"), ROWS_OF_THE_RUN.get(name, ()))
    if as_json:
        print(json.dumps(results))
    else:
        for name, found in results.items():
            print(f"{name}: {found['lines']} code lines in {found['files']} files (features apart)")
            for path, entry in {**found["by_file"], **found["features"]}.items():
                print(f"  {path}: {entry['lines']} ({', '.join(entry['functions'])})")
