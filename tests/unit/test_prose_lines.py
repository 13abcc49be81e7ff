"""scripts/prose_lines.py: the comment, docstring and inline-comment lines of a file, as issue 43 measures them."""

from helpers import load_script

SOURCE = '''"""A module docstring
on two lines."""

# a comment line
x = 1  # an inline comment
y = 2  # feature: ema


def f():
    """One line."""
    return {  # inline
        "#": 2,
    }
'''


def test_prose_lines_counts_each_kind_once_and_markers_not_at_all():
    prose = load_script("prose_lines").prose_of(SOURCE)
    assert prose._asdict() == {"code": 6, "comments": 1, "docstrings": 3, "inline_comments": 2}
