"""Every optional feature can be deleted: docs/features.md's table, applied to a copy of the repository.

For each row: its files deleted, its config keys removed, its marked lines (`# feature: <name>`) deleted, and in
the docs its marked lines and blocks (`<!-- feature: <name> -->`) and its row of the table; then
nothing left names its modules, ruff finds no unused import or undefined name, `python train.py` trains the
default run (one epoch) and the core's quick tests pass, all in the copy. The table is the one list: a feature
added there is deleted here, and one whose deletion needs more than the table says fails here.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from template.test_docs_links import anchors_in, links_in

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "features.md"
MARKER = re.compile(r"#\s*feature:\s*([\w-]+)")
# In markdown, invisible when rendered: a line ending in the marker, or a block from a line holding only the marker
# to a line holding only its closing one (`<!-- /feature: <name> -->`).
DOC_MARKER = re.compile(r"<!--\s*(/?)feature:\s*([\w-]+)\s*-->")
# What the docs may call a feature by, beyond its files' paths: none of it may outlive its deletion.
DOC_NAMES = {"lr_finder": r"lr.?find|range test|lr_finder"}
# The core's quick tests: the config, checkpoints and the runtime, none of which may need a feature.
CORE_TESTS = (
    "tests/unit/config/test_config.py::test_default_config_validates",
    "tests/unit/config/test_declared.py",
    "tests/unit/checkpointing/test_checkpoint.py",
    "tests/unit/test_runtime.py",
    "tests/unit/tasks/test_batches.py",
)


def features() -> dict[str, dict]:
    """{name: {"files": [...], "config": {file: [keys]}, "marked": {file: count}, "places": n}} from the table."""
    rows = {}
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        name = re.match(r"`([\w-]+)`", cells[0]).group(1)  # type: ignore[union-attr]
        config: dict[str, list[str]] = {}
        for part in filter(None, (p.strip() for p in cells[2].split(";"))):
            file, keys = part.split(":", 1)
            config[file.strip(" `")] = re.findall(r"`([^`]+)`", keys)
        marked = {file: int(count) for file, count in re.findall(r"`([^`]+)`: (\d+)", cells[3])}
        rows[name] = {"files": re.findall(r"`([^`]+)`", cells[1]), "config": config, "marked": marked}
        rows[name]["places"] = int(cells[4])
    return rows


FEATURES = features()


def remove_key(text: str, key: str) -> str:
    """`text` (a YAML file) without the block of the dotted `key`: its line and the more indented lines below,
    found by indentation, so comments and the layout of the rest are kept. A parent left empty goes too."""
    lines, start, indent = text.splitlines(keepends=True), 0, -1
    *parents, last = key.split(".")
    stack = []
    for part in [*parents, last]:
        for number in range(start, len(lines)):
            line = lines[number]
            depth = len(line) - len(line.lstrip(" "))
            if line.strip() and not line.lstrip().startswith("#") and depth <= indent:
                raise AssertionError(f"{key}: no {part!r} inside its parent")
            if depth > indent and re.match(rf"{re.escape(part)}\s*:", line.lstrip()):
                stack.append((number, depth))
                start, indent = number + 1, depth
                break
        else:
            raise AssertionError(f"{key} is not in the file")
    begin, depth = stack[-1]
    end = begin + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip(" ")) > depth):
        end += 1
    while end > begin + 1 and not lines[end - 1].strip():  # blank lines after the block belong to what follows
        end -= 1
    kept = lines[:begin] + lines[end:]
    if len(stack) > 1:  # a parent whose every key went
        parent, parent_depth = stack[-2]
        below = kept[parent + 1 :]
        children = [line for line in below if line.strip() and not line.lstrip().startswith("#")]
        if not children or len(children[0]) - len(children[0].lstrip(" ")) <= parent_depth:
            return remove_key("".join(kept), ".".join(key.split(".")[:-1]))
    return "".join(kept)


def test_remove_key_keeps_the_rest_of_the_file():
    text = "a:\n  b: 1   # one\n  c:\n    d: 2\n\n    e: 3\n  f: 4\ng: 5\n"
    assert remove_key(text, "a.c") == "a:\n  b: 1   # one\n  f: 4\ng: 5\n"
    assert remove_key(text, "a.c.d") == "a:\n  b: 1   # one\n  c:\n\n    e: 3\n  f: 4\ng: 5\n"
    assert remove_key("a:\n  b: 1\ng: 5\n", "a.b") == "g: 5\n"


def test_the_table_lists_features_and_every_marked_line_belongs_to_one():
    assert FEATURES, f"no rows in {TABLE}"
    for path in marked_files(ROOT):
        for name in MARKER.findall(path.read_text(encoding="utf-8")):
            assert name in FEATURES, f"{path.relative_to(ROOT)} marks a line for {name}, which {TABLE.name} lacks"
    for path in doc_files(ROOT):
        for _, name in DOC_MARKER.findall(path.read_text(encoding="utf-8")):
            assert name in FEATURES, f"{path.relative_to(ROOT)} marks a line for {name}, which {TABLE.name} lacks"


def test_marked_doc_lines_and_blocks_go_and_nothing_else():
    text = (
        "a\nb <!-- feature: x -->\n  <!-- feature: x -->\nc\n<!-- feature: y -->\nd\n<!-- /feature: y -->\n"
        "  <!-- /feature: x -->\ne\n"
    )
    assert without_marked_docs(text, "x") == "a\ne\n"
    only_x = "a\nb <!-- feature: x -->\n  <!-- feature: x -->\nc\n  <!-- /feature: x -->\ne\n"
    assert without_marked_docs(text, "y") == only_x
    with pytest.raises(AssertionError, match="no closing"):
        without_marked_docs("a\n<!-- feature: x -->\nb\n", "x")


@pytest.mark.parametrize("name", list(FEATURES))
def test_deleting_the_feature_leaves_no_doc_naming_it_and_every_link_resolves(name):
    """The docs' side of a deletion, on text alone: after its marked doc lines, its table row, its config keys and
    its files go, no line of README.md, CONTRIBUTING.md, docs/ or conf/ names a file it deleted (or, for a feature
    in DOC_NAMES, calls it by its name), and every relative link still reaches a file and a heading."""
    feature = FEATURES[name]
    deleted = {ROOT / file for file in feature["files"]}
    texts = {}
    for path in [*doc_files(ROOT), *sorted((ROOT / "conf").rglob("*.yaml"))]:
        if path in deleted or any(folder in path.parents for folder in deleted):
            continue
        text = path.read_text(encoding="utf-8")
        for key in feature["config"].get(str(path.relative_to(ROOT)), []):
            text = remove_key(text, key)
        texts[path] = without_docs_of(path.relative_to(ROOT), text, name)
    named = [re.escape(file) for file in feature["files"]]
    named += [re.escape(file.removeprefix("src/trainkit/")) for file in feature["files"] if file.startswith("src/")]
    pattern = re.compile("|".join([*named, *([DOC_NAMES[name]] if name in DOC_NAMES else [])]), re.IGNORECASE)
    left = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path, text in texts.items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert left == [], f"{name} deleted, the docs still name it:\n" + "\n".join(left)
    for path, text in texts.items():
        if path.suffix != ".md":
            continue
        for link in links_in(text):
            target, _, anchor = link.partition("#")
            target_path = (path.parent / target).resolve() if target else path
            assert target_path.exists() and target_path not in deleted, f"{path.relative_to(ROOT)}: {link} is gone"
            if anchor and target_path in texts:
                assert anchor in anchors_in(texts[target_path]), f"{path.relative_to(ROOT)}: {link}: no such heading"


def test_the_config_check_names_no_feature():
    """trainkit.config checks the core's keys and gathers each feature's checks from the module its section names
    (`_checks_`): a feature's name, module or config key there would outlive deleting the feature."""
    names = set()
    for name, feature in FEATURES.items():
        names |= {name, *(Path(file).stem for file in feature["files"] if file.endswith(".py"))}
        names |= {key.split(".")[-1] for keys in feature["config"].values() for key in keys}
    for path in sorted((ROOT / "src" / "trainkit" / "config").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        named = sorted(name for name in names if re.search(rf"\b{re.escape(name)}\b", text))
        assert not named, f"{path.relative_to(ROOT)} names {', '.join(named)}"


def marked_files(root: Path) -> list[Path]:
    """Where a marked line may be: the entry points, the scripts (Python and shell), the package."""
    return [
        root / "train.py",
        root / "eval.py",
        *root.glob("scripts/*.py"),
        *root.glob("scripts/*.sh"),
        *root.glob("src/**/*.py"),
    ]


def doc_files(root: Path) -> list[Path]:
    """Where a marked doc line may be: the README, CONTRIBUTING.md and docs/."""
    return [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]


def without_marked_docs(text: str, name: str) -> str:
    """`text` (markdown) without what it marks as `name`'s: each line ending in `<!-- feature: <name> -->`, and each
    block from a line holding only that marker to a line holding only `<!-- /feature: <name> -->`, both included."""
    kept, inside = [], False
    for line in text.splitlines(keepends=True):
        alone = DOC_MARKER.fullmatch(line.strip())
        if inside:
            inside = not (alone and alone.groups() == ("/", name))
        elif alone and alone.groups() == ("", name):
            inside = True
        elif not re.search(rf"<!--\s*feature:\s*{re.escape(name)}\s*-->\s*$", line):
            kept.append(line)
    assert not inside, f"<!-- feature: {name} --> has no closing <!-- /feature: {name} -->"
    return "".join(kept)


def without_docs_of(relative: Path, text: str, name: str) -> str:
    """A doc file's `text` once `name` is deleted: its marked lines and blocks, and in the table its row."""
    if relative.suffix != ".md":
        return text
    if relative == TABLE.relative_to(ROOT):
        text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(f"| `{name}`"))
    return without_marked_docs(text, name)


def copy_of_the_repository(destination: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def delete(copy: Path, name: str, feature: dict) -> None:
    """What the table says deleting `name` takes, done to `copy`; the marked lines counted as it says."""
    for file in feature["files"]:
        path = copy / file
        assert path.exists(), f"{name}: {file} is listed but does not exist"
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for file, keys in feature["config"].items():
        path = copy / file
        text = path.read_text(encoding="utf-8")
        for key in keys:
            text = remove_key(text, key)
        path.write_text(text, encoding="utf-8")
    marked = {}
    for path in marked_files(copy):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if name not in MARKER.findall(line)]
        if len(kept) < len(lines):
            marked[str(path.relative_to(copy))] = len(lines) - len(kept)
            path.write_text("".join(kept), encoding="utf-8")
    assert marked == feature["marked"], f"{name}: the marked lines are {marked}, the table says {feature['marked']}"
    for path in doc_files(copy):
        text = path.read_text(encoding="utf-8")
        path.write_text(without_docs_of(path.relative_to(copy), text, name), encoding="utf-8")


def leftover_references(copy: Path, feature: dict) -> list[str]:
    """Code still importing (or naming in a string, a YAML value) a module or script the feature's deletion
    removed, or a shell script still running it; a comment may still point at it."""
    patterns = []
    for file in feature["files"]:
        if file.startswith("src/"):
            module = re.escape(
                file.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            )
            patterns.append((module, rf"(import|from)\s+{module}\b|[\"']{module}\b", rf"\b{module}\b"))
        elif file.startswith("scripts/") and file.endswith(".py"):
            script = re.escape(Path(file).stem)
            python = rf"(import|from)\s+{script}\b|load_script\([\"']{script}[\"']\)"
            patterns.append((file, python, rf"^[^#]*\b{re.escape(file)}\b"))
    found = []
    for path in [*copy.rglob("*.py"), *copy.rglob("*.yaml"), *copy.rglob("*.sh")]:
        text = path.read_text(encoding="utf-8")
        for name, in_python, elsewhere in patterns:
            if re.search(in_python if path.suffix == ".py" else elsewhere, text, re.MULTILINE):
                found.append(f"{path.relative_to(copy)} names {name}")
    return found


def run(command: list[str], copy: Path, timeout: int) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(copy / "src"), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(command, cwd=copy, env=environment, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.template
@pytest.mark.parametrize("name", list(FEATURES))
def test_deleting_the_feature_leaves_a_template_that_trains(name, tmp_path):
    feature = FEATURES[name]
    places = 1 + len(feature["config"]) + len(feature["marked"])  # its files, each config file, each marked file
    assert feature["places"] == places, f"{name}: the table says {feature['places']} places, the rows give {places}"
    copy = copy_of_the_repository(tmp_path / "repository")
    delete(copy, name, feature)
    assert leftover_references(copy, feature) == []
    assert_a_template_that_trains(copy, tmp_path)


# Every key a rule of the core checks exists with no tracker at all (a rule on a key no option has fails it).
NO_TRACKER_TESTS = ("tests/unit/config/test_config.py::test_every_rule_key_exists_in_some_option",)


@pytest.mark.slow
@pytest.mark.template
def test_deleting_every_tracker_at_once_leaves_a_template_that_trains(tmp_path):
    """The trackers are each deletable, and so are all of them: nothing the core reads lives only in their files."""
    names = [name for name in FEATURES if FEATURES[name]["files"][0].startswith("src/trainkit/tracking/loggers/")]
    assert sorted(names) == ["csv", "mlflow", "tensorboard", "wandb"]
    copy = copy_of_the_repository(tmp_path / "repository")
    for name in names:
        delete(copy, name, FEATURES[name])
        assert leftover_references(copy, FEATURES[name]) == []
    assert_a_template_that_trains(copy, tmp_path, NO_TRACKER_TESTS)


def assert_a_template_that_trains(copy: Path, tmp_path: Path, more_tests: tuple[str, ...] = ()) -> None:
    """In `copy`: ruff finds no unused import or undefined name, each shell script parses, `python train.py`
    trains one epoch, and the core's quick tests (and `more_tests`) pass, and so do the template's own quick tests
    (the README's named step, its keys, the docs' links, the style: all of tests/template/ but this file), which a
    deletion the table allows must leave green too; test_contributing.py, which trains every recipe of the core for
    about two minutes, is left to the suite itself."""
    lint = run([sys.executable, "-m", "ruff", "check", "--select", "F", "--quiet", "."], copy, 120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for script in copy.glob("scripts/*.sh"):
        assert run(["bash", "-n", str(script)], copy, 60).returncode == 0, f"{script.name} is no longer valid shell"
    trained = run([sys.executable, "train.py", "trainer.max_epochs=1", f"hydra.run.dir={tmp_path / 'run'}"], copy, 600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    pytest_quick = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow"]
    core = run([*pytest_quick, *CORE_TESTS, *more_tests], copy, 900)
    assert core.returncode == 0, core.stdout[-3000:]
    template = sorted(str(path.relative_to(copy)) for path in (copy / "tests" / "template").glob("test_*.py"))
    template.remove("tests/template/test_features.py")  # this test itself
    template.remove("tests/template/test_contributing.py")  # the recipes touch no feature: 12 s here instead of 160
    checked = run([*pytest_quick, *template], copy, 1800)
    assert checked.returncode == 0, checked.stdout[-3000:]
