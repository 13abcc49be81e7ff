"""The README is a map into docs/: every relative link in README.md, CONTRIBUTING.md and docs/*.md
reaches a file that exists and, after a `#`, a heading that file has (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED_BLOCK = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    return anchors_in(path.read_text(encoding="utf-8"))


def anchors_in(text: str) -> set[str]:
    """GitHub's heading anchors of a markdown text: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = FENCED_BLOCK.sub("", text)
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def links(path: Path) -> list[str]:
    return links_in(path.read_text(encoding="utf-8"))


def links_in(text: str) -> list[str]:
    """The relative links of a markdown text (outside code blocks)."""
    text = FENCED_BLOCK.sub("", text)
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]  # not http:, mailto:


def test_the_docs_are_there():
    assert len(DOCUMENTS) > 2, "no docs/*.md"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(document):
    for link in links(document):
        target, _, anchor = link.partition("#")
        target_path = (document.parent / target).resolve() if target else document
        assert target_path.exists(), f"{link}: no {target_path.relative_to(ROOT)}"
        if anchor:
            assert target_path.suffix == ".md", link
            assert anchor in anchors(target_path), f"{link}: no heading with anchor #{anchor}"
