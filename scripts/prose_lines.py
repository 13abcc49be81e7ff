"""Counts the lines of prose in Python files: comment lines, docstring lines and code lines that carry a comment.

    python scripts/prose_lines.py train.py src/trainkit/tasks src/trainkit/data

A comment line holds only a comment; a docstring line is a line of a module's, class's or function's docstring; an
inline comment is a code line that ends in one; prose is the three together. Comments that are markers for tools
(`# feature: <name>`, type and noqa pragmas) are not prose. Folders are read recursively (their *.py files). Prints
one row per argument and their total.
"""

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import NamedTuple

# Markers for tools, not prose: feature markers (scripts/trim.py reads them), type: and noqa pragmas.
MARKER = re.compile(r"#\s*(feature:|type:|noqa)")


class Prose(NamedTuple):
    code: int
    comments: int
    docstrings: int
    inline_comments: int

    def __add__(self, other):
        return Prose(*(a + b for a, b in zip(self, other)))


def docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and type(first.value.value) is str:
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def prose_of(source: str) -> Prose:
    """The counts of one file's text."""
    docstrings = docstring_lines(ast.parse(source))
    comment_rows: set[int] = set()
    code_rows: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if not MARKER.match(token.string):
                comment_rows.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_rows.update(range(token.start[0], token.end[0] + 1))
    code_rows -= docstrings
    return Prose(
        code=len(code_rows),
        comments=len(comment_rows - code_rows - docstrings),
        docstrings=len(docstrings),
        inline_comments=len(comment_rows & code_rows),
    )


def prose_under(path: Path) -> Prose:
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return sum((prose_of(file.read_text()) for file in files), Prose(0, 0, 0, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="Python files or folders")
    args = parser.parse_args(argv)
    rows = [(str(path), prose_under(path)) for path in args.paths]
    rows.append(("total", sum((prose for _, prose in rows), Prose(0, 0, 0, 0))))
    print(f"{'path':40} {'code':>6} {'comment':>8} {'docstring':>10} {'inline':>7} {'prose':>6}")
    for name, prose in rows:
        total_prose = prose.comments + prose.docstrings + prose.inline_comments
        print(
            f"{name:40} {prose.code:6d} {prose.comments:8d} {prose.docstrings:10d} {prose.inline_comments:7d}"
            f" {total_prose:6d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
