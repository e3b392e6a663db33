"""Heading anchors as GitHub and the docs site (MkDocs, Python-Markdown's toc) make them, and the links to them.

The two rules differ: GitHub lowercases, drops punctuation and turns every space into a hyphen, so "a + b" is
``a--b``; the site's ``toc.slugify`` collapses a run of spaces and hyphens into one, ``a-b``. A heading whose two
slugs agree has one anchor on both; docs/ links only to such headings (tests/project/test_doc_links.py).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from markdown.extensions.toc import slugify as site_slugify

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"\]\(([^)\s]*)\)")


def heading_text(markdown: str) -> str:
    """What a heading renders to: links as their text, code and emphasis marks dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text)


def github_slug(text: str) -> str:
    """GitHub's anchor of a heading's text: lowercase, anything but letters, digits, '-', '_' and spaces dropped,
    each space a hyphen."""
    kept = "".join(c for c in text.lower() if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def site_slug(text: str) -> str:
    """The docs site's anchor (MkDocs' default: Python-Markdown's toc slugify)."""
    return site_slugify(text, "-")


@dataclass(frozen=True)
class Heading:
    page: Path
    line: int
    text: str

    @property
    def slugs(self) -> tuple[str, str]:
        return github_slug(self.text), site_slug(self.text)


def _prose(page: Path):
    """(line number, line) of ``page`` outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def headings(page: Path) -> list[Heading]:
    return [Heading(page, n, heading_text(m.group(2))) for n, line in _prose(page) if (m := _HEADING.match(line))]


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: Path  # the page linked to (``page`` itself for "#anchor")
    anchor: str


def anchor_links(page: Path) -> list[Link]:
    """Links of ``page`` to a heading of a markdown page (``x.md#anchor``, ``#anchor``); other links are not here."""
    links = []
    for number, line in _prose(page):
        for target in _LINK.findall(line):
            path, _, anchor = target.partition("#")
            if not anchor or "://" in path or (path and not path.endswith(".md")):
                continue
            links.append(Link(page, number, (page.parent / path).resolve() if path else page, anchor))
    return links
