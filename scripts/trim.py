"""Trim the template to what you need: remove capabilities by docs/features.md's table.

    python scripts/trim.py                          # each capability: its places, lines and packages
    python scripts/trim.py --drop muon --dry-run    # what dropping it would remove, changing nothing
    python scripts/trim.py --drop muon,ema          # remove them from this working tree
    python scripts/trim.py --keep ema               # remove every capability but these (and what they need)

Dropping a capability deletes its files, removes its config keys, its marked lines (`# feature: <name>` in code,
in conf/'s yaml and in pyproject.toml, `<!-- feature: <name> -->` lines and blocks in the docs, and its row of the
table) and its packages from pyproject.toml and environment.yml. A capability that needs a dropped one is dropped
with it; a file that two rows list needs both, and goes with either. A real run refuses a git tree with uncommitted
changes, so that the trim is one commit of its own: rerun the same trim after merging later template fixes.
tests/template/test_features.py applies the table with this module's `drop`.
"""

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = Path("docs") / "features.md"
MARKER = re.compile(r"#\s*feature:\s*([\w-]+)")
# In markdown, invisible when rendered: a line ending in the marker, or a block from a line holding only the marker
# to a line holding only its closing one (`<!-- /feature: <name> -->`).
DOC_MARKER = re.compile(r"<!--\s*(/?)feature:\s*([\w-]+)\s*-->")
# A line may end in the markers of several capabilities (it needs each of them): it goes with any one.
DOC_LINE_MARKERS = re.compile(r"(?:\s*<!--\s*feature:\s*[\w-]+\s*-->)+\s*$")
COLUMNS = 7  # capability, files, config keys, marked lines, packages, needs, places
DEPENDENCY_FILES = ("pyproject.toml", "environment.yml")
TEST_COMMAND = 'python -m pytest -q -m "not slow" && python train.py trainer.max_epochs=1'


class TrimError(Exception):
    """What trim.py refuses, said in one line: what is wrong and how to go on."""


@dataclass
class Capability:
    """One row of the table: what dropping `name` deletes (`files`), edits (`config` keys by file, the number of
    `marked` code lines by file, `packages` in the dependency files) and which capabilities it `needs`."""

    name: str
    files: list[str]
    config: dict[str, list[str]]
    marked: dict[str, int]
    packages: list[str]
    needs: list[str]
    places: int
    shared: frozenset[str] = frozenset()  # its files that another row lists too: whichever goes first deletes them

    def counted_places(self, root: Path, docs: bool = True) -> int:
        """The places rule: all its files count one, and each existing file it edits one more: each config file,
        marked code file and dependency file, and (unless `docs` is False) each doc file with its marked lines or
        blocks. The table itself is not counted: its row is the registry, and every row edits it."""
        edited = {*self.config, *self.marked}
        if self.packages:
            edited |= {file for file in DEPENDENCY_FILES if package_lines((root / file).read_text(), self.packages)}
        for path in doc_files(root) if docs else ():
            text = path.read_text(encoding="utf-8")
            if path.relative_to(root) != TABLE and without_marked_docs(text, self.name) != text:
                edited.add(str(path.relative_to(root)))
        return (1 if self.files else 0) + len(edited)


@dataclass
class Removed:
    """What dropping one capability removed (or would remove): lines by file, for the report."""

    files: dict[str, int] = field(default_factory=dict)
    config: dict[str, list[str]] = field(default_factory=dict)
    marked: dict[str, int] = field(default_factory=dict)
    docs: dict[str, int] = field(default_factory=dict)
    packages: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> int:
        return sum(self.files.values()) + sum(self.marked.values()) + sum(self.docs.values())


def read_table(root: Path = ROOT) -> dict[str, Capability]:
    """The capabilities of root's docs/features.md, by name, in the table's order."""
    rows = {}
    for line in (root / TABLE).read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != COLUMNS or not cells[0].startswith("`"):
            continue
        name = re.match(r"`([\w-]+)`", cells[0]).group(1)  # type: ignore[union-attr]
        config: dict[str, list[str]] = {}
        for part in filter(None, (p.strip() for p in cells[2].split(";"))):
            file, keys = part.split(":", 1)
            config[file.strip(" `")] = re.findall(r"`([^`]+)`", keys)
        marked = {file: int(count) for file, count in re.findall(r"`([^`]+)`: (\d+)", cells[3])}
        files, packages, needs = (re.findall(r"`([^`]+)`", cells[column]) for column in (1, 4, 5))
        rows[name] = Capability(name, files, config, marked, packages, needs, int(cells[6]))
    for row in rows.values():
        others = {file for other in rows.values() if other is not row for file in other.files}
        row.shared = frozenset(others.intersection(row.files))
        for needed in row.needs:
            if needed not in rows:
                raise TrimError(f"{TABLE}: {row.name} needs {needed}, which has no row: add it or fix the needs cell")
    return rows


def to_drop(rows: dict[str, Capability], drop: list[str]) -> list[str]:
    """`drop` and every capability that needs one of them, in the table's order."""
    unknown = [name for name in drop if name not in rows]
    if unknown:
        raise TrimError(f"no capability {', '.join(unknown)} in {TABLE}: the names are {', '.join(rows)}")
    dropped = set(drop)
    while grown := {row.name for row in rows.values() if set(row.needs) & dropped} - dropped:
        dropped |= grown
    return [name for name in rows if name in dropped]


def to_keep(rows: dict[str, Capability], keep: list[str]) -> list[str]:
    """Every capability but `keep` and what they need (and what that needs)."""
    to_drop(rows, keep)  # refuses an unknown name
    kept = set(keep)
    while grown := {needed for name in kept for needed in rows[name].needs} - kept:
        kept |= grown
    return [name for name in rows if name not in kept]


def remove_key(text: str, key: str) -> str:
    """`text` (a YAML file) without the block of the dotted `key`: its line and the more indented lines below,
    found by indentation, so comments and the layout of the rest are kept. A parent left empty goes too."""
    lines, start, indent = text.splitlines(keepends=True), 0, -1
    stack = []
    for part in key.split("."):
        for number in range(start, len(lines)):
            line = lines[number]
            depth = len(line) - len(line.lstrip(" "))
            if line.strip() and not line.lstrip().startswith("#") and depth <= indent:
                raise TrimError(f"{key}: no {part!r} inside its parent: fix the row's config keys")
            if (depth == 0 if indent < 0 else depth > indent) and re.match(rf"{re.escape(part)}\s*:", line.lstrip()):
                stack.append((number, depth))
                start, indent = number + 1, depth
                break
        else:
            raise TrimError(f"{key} is not in the file: fix the row's config keys")
    begin, depth = stack[-1]
    end = begin + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip(" ")) > depth):
        end += 1
    while end > begin + 1 and not lines[end - 1].strip():  # blank lines after the block belong to what follows
        end -= 1
    if begin > 0 and not lines[begin - 1].strip() and end < len(lines) and not lines[end].strip():
        end += 1  # a block between two blank lines: one of them goes with it
    kept = lines[:begin] + lines[end:]
    if len(stack) > 1:  # a parent whose every key went
        parent, parent_depth = stack[-2]
        children = [line for line in kept[parent + 1 :] if line.strip() and not line.lstrip().startswith("#")]
        if not children or len(children[0]) - len(children[0].lstrip(" ")) <= parent_depth:
            return remove_key("".join(kept), key.rpartition(".")[0])
    return "".join(kept)


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
        elif name not in line_markers(line):
            kept.append(line)
    if inside:
        raise TrimError(f"<!-- feature: {name} --> has no closing <!-- /feature: {name} -->: add it")
    return "".join(kept)


def line_markers(line: str) -> list[str]:
    """The capabilities a markdown line ends in the markers of: it needs each of them."""
    markers = DOC_LINE_MARKERS.search(line)
    return [name for _, name in DOC_MARKER.findall(markers.group())] if markers else []


def without_docs_of(relative: Path, text: str, name: str, files: Iterable[str] = ()) -> str:
    """A doc file's `text` once `name` is dropped: its marked lines and blocks, and in the table its row, and its
    `files` from the files cell of a row that lists them too (they are gone)."""
    if relative.suffix != ".md":
        return text
    if relative == TABLE:
        text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(f"| `{name}`"))
        text = "".join(without_files_listed(line, files) for line in text.splitlines(keepends=True))
    return without_marked_docs(text, name)


def without_files_listed(line: str, files: Iterable[str]) -> str:
    """A row of the table without `files` in its files cell, nor its marked lines in them (one place fewer each);
    any other line as it is."""
    cells = line.split("|")
    if not line.startswith("| `") or len(cells) != COLUMNS + 2:
        return line
    listed = re.findall(r"`([^`]+)`", cells[2])
    marked = re.findall(r"`([^`]+)`: (\d+)", cells[4])
    gone = [file for file, _ in marked if file in files]
    if not set(files) & set(listed) and not gone:
        return line
    cells[2] = " " + ", ".join(f"`{file}`" for file in listed if file not in files) + " "
    cells[4] = " " + "; ".join(f"`{file}`: {count}" for file, count in marked if file not in files) + " "
    cells[7] = f" {int(cells[7]) - sum(f'`{file}`' not in cells[3] for file in gone)} "  # a config file still counts
    return "|".join(cells)


def without_marked_lines(text: str, name: str) -> str:
    """`text` (code or yaml) without its lines marked `# feature: <name>`, and without a blank line between two of
    them (ruff format puts one after an import), which would be left doubled with the blank line after them."""
    lines = text.splitlines(keepends=True)
    marked = [name in MARKER.findall(line) for line in lines]
    between = {i for i in range(1, len(lines) - 1) if not lines[i].strip() and marked[i - 1] and marked[i + 1]}
    return "".join(line for i, line in enumerate(lines) if not marked[i] and i not in between)


def package_lines(text: str, packages: list[str]) -> list[str]:
    """The lines of a dependency file that require one of `packages`: a requirement alone on its line, or a
    one-line list of them (an extra of pyproject.toml) that would be left empty."""
    names = "|".join(re.escape(package) for package in packages)
    requirement = rf"\s*(-\s*)?\"?({names})(?=[\s<>=!~;\[\]\"',]|$)"
    found = []
    for line in text.splitlines():
        listed = re.fullmatch(r"\s*[\w-]+\s*=\s*\[(.*)\]\s*(#.*)?", line)
        if re.match(requirement, line, re.IGNORECASE) or (
            listed and all(re.match(requirement, item, re.I) for item in listed.group(1).split(",") if item.strip())
        ):
            found.append(line)
    return found


def without_packages(text: str, packages: list[str]) -> str:
    """A dependency file's `text` without the lines `package_lines` finds, and the comment lines just above a
    one-line list that goes (they describe it)."""
    going = set(package_lines(text, packages))
    kept: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") in going:
            if "[" in line:
                while kept and kept[-1].lstrip().startswith("#"):
                    kept.pop()
            continue
        kept.append(line)
    return "".join(kept)


def marked_files(root: Path) -> list[Path]:
    """Where a marked code line may be: the entry points, the scripts (Python, and shell: scripts/gpu_checks/ too),
    the package, conf/, and pyproject.toml (a setting for a row's package)."""
    entry_points = [path for path in (root / "train.py", root / "eval.py", root / "pyproject.toml") if path.is_file()]
    scripts = [*root.glob("scripts/*.py"), *sorted(root.glob("scripts/**/*.sh"))]
    return [*entry_points, *scripts, *root.glob("src/**/*.py"), *sorted(root.glob("conf/**/*.yaml"))]


def doc_files(root: Path) -> list[Path]:
    """Where a marked doc line may be: the README, CONTRIBUTING.md and docs/."""
    readmes = [path for path in (root / "README.md", root / "CONTRIBUTING.md") if path.is_file()]
    return [*readmes, *sorted((root / "docs").glob("*.md"))]


def line_count(path: Path) -> int:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return sum(len(file.read_bytes().splitlines()) for file in files if file.is_file())


def left_empty(folder: Path) -> bool:
    """A folder with nothing left in it (a config group) or a package with nothing left but its __init__.py."""
    return {path.name for path in folder.iterdir()} <= {"__init__.py", "__pycache__"}


def drop(root: Path, row: Capability, write: bool = True) -> Removed:
    """Remove `row`'s capability from the tree at `root` (with write=False, only say what would go)."""
    removed = Removed()
    for file in row.files:
        path = root / file
        if not path.exists() and file in row.shared:
            continue  # another row listed it too and was dropped first
        if not path.exists():
            raise TrimError(f"{TABLE}: {row.name} lists {file}, which does not exist: fix the row")
        removed.files[file] = line_count(path)
        if write:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            while (path := path.parent) != root and left_empty(path):
                if (init := path / "__init__.py").exists():
                    removed.files[str(init.relative_to(root))] = line_count(init)
                shutil.rmtree(path)

    def edit(path: Path, text: str) -> None:
        if write:
            path.write_text(text, encoding="utf-8")

    for file, keys in row.config.items():
        text = (root / file).read_text(encoding="utf-8")
        for key in keys:
            text = remove_key(text, key)
        removed.config[file] = keys
        edit(root / file, text)
    for path in marked_files(root):
        text = path.read_text(encoding="utf-8")
        kept = without_marked_lines(text, row.name)
        if kept != text:
            marked = sum(row.name in MARKER.findall(line) for line in text.splitlines())  # not the blank lines
            removed.marked[str(path.relative_to(root))] = marked
            edit(path, kept)
    for path in doc_files(root):
        text = path.read_text(encoding="utf-8")
        trimmed = without_docs_of(path.relative_to(root), text, row.name, row.files)
        if trimmed != text:
            removed.docs[str(path.relative_to(root))] = len(text.splitlines()) - len(trimmed.splitlines())
            edit(path, trimmed)
    for file in DEPENDENCY_FILES if row.packages else ():
        text = (root / file).read_text(encoding="utf-8")
        if lines := package_lines(text, row.packages):
            removed.packages[file] = [line.strip() for line in lines]
            edit(root / file, without_packages(text, row.packages))
    return removed


def describe(name: str, removed: Removed) -> str:
    parts = [f"{len(removed.files)} files and folders ({sum(removed.files.values()):,} lines): "]
    parts[0] += ", ".join(removed.files)
    parts += [f"{file}: {', '.join(keys)}" for file, keys in removed.config.items()]
    parts += [f"{file}: {count} marked line{'s' * (count > 1)}" for file, count in removed.marked.items()]
    parts += [f"{file}: {count} doc line{'s' * (count > 1)}" for file, count in removed.docs.items()]
    parts += [f"{file}: {'; '.join(lines)}" for file, lines in removed.packages.items()]
    return f"{name}:\n  " + "\n  ".join(parts)


def table(root: Path, rows: dict[str, Capability]) -> str:
    packages = {name: ", ".join(row.packages) or "-" for name, row in rows.items()}
    width = max(len("packages"), *map(len, packages.values()))
    header = f"{'capability':<20} {'places':>6} {'lines':>7}  {'packages':<{width}}  needs"
    body = [
        f"{row.name:<20} {row.places:>6} {drop(root, row, write=False).lines():>7,}  "
        f"{packages[row.name]:<{width}}  {', '.join(row.needs) or '-'}"
        for row in rows.values()
    ]
    return "\n".join([header, *body])


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--drop", help="capabilities to remove, comma-separated (those that need them go too)")
    chosen.add_argument("--keep", help="capabilities to keep, comma-separated: every other one is removed")
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed and change nothing")
    args = parser.parse_args(argv)
    try:
        rows = read_table(root)
        if not args.drop and not args.keep:
            print(table(root, rows))
            return 0
        wanted = [name.strip() for name in (args.drop or args.keep).split(",") if name.strip()]
        names = to_drop(rows, wanted) if args.drop else to_keep(rows, wanted)
        if args.drop and (pulled := [name for name in names if name not in wanted]):
            print(f"also dropping {', '.join(pulled)}: they need what is dropped (the needs column of {TABLE})")
        if not args.dry_run:  # a tree outside git is refused as well
            status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
            if status.returncode != 0:
                raise TrimError(
                    f"{root} is not a git checkout: trim a clone (git clone <template> <yours>), not a copy"
                )
            if status.stdout:
                raise TrimError(f"{root} has uncommitted changes: commit or discard them first (git status lists them)")
        for name in names:
            removed = drop(root, rows[name], write=not args.dry_run)
            print(("would remove " if args.dry_run else "removed ") + describe(name, removed))
    except TrimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if not args.dry_run:
        print(f"\nNow check what is left:  {TEST_COMMAND}")
        print(f'Then record the trim as one commit:  git commit -am "trim: drop {", ".join(names)}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
