"""The fenced code blocks of README.md and docs/, the marker that says which test covers each, and their commands.

A block that shows commands or code (```bash, ```console, ```python, ```sh) carries an HTML comment on the
line right above its fence, invisible on GitHub and on the site:

    <!-- test: walk -->                 run, in page order, by tests/project/test_readme.py::test_newcomer_walk
    <!-- test: config (why not run) --> every command's config composed and checked, as the entry point would
    <!-- test: tests/FILE.py::NAME -->   run by that test (which reads the block, or runs the same command)
    <!-- not run: REASON -->            not run; the reason is shown as the test's skip reason

Every block that is not ``not run`` also has its commands' configs composed (tests/project/test_readme.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CODE_LANGS = ("bash", "sh", "shell", "console", "python")
_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(test|not run)\s*:\s*(.*?)\s*-->$")
_COMMAND_LINE = re.compile(r"^\s*(\$ |\.venv/bin/|python |torchrun |make )")


def pages() -> list[Path]:
    """README.md, then every page of docs/ (the generated configuration reference included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    kind: str  # "test", "not run" or "" (no marker)
    detail: str  # what follows "test:" / "not run:"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def shows_commands(self) -> bool:
        """A block a reader would copy and run: a code language, or untagged lines that look like commands."""
        if self.lang in CODE_LANGS:
            return True
        return self.lang == "" and any(_COMMAND_LINE.match(line) for line in self.text.splitlines())

    @property
    def named_test(self) -> str | None:
        """``tests/FILE.py::NAME`` of a ``test: tests/...`` marker."""
        if self.kind == "test" and self.detail.startswith("tests/"):
            return self.detail.split()[0]
        return None

    @property
    def is_walk(self) -> bool:
        return self.kind == "test" and self.detail == "walk"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence[:3]))
        marker = _MARKER.match(lines[i - 1].strip()) if i > 0 else None
        kind, detail = marker.groups() if marker else ("", "")
        out.append(Block(page, i + 1, lang, "\n".join(lines[i + 1 : end]), kind, detail))
        i = end + 1
    return out


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def block_containing(page: Path, text: str, lang: str | None = None) -> Block:
    """The one block of ``page`` (of language ``lang``) that contains ``text``."""
    found = [b for b in blocks(page) if text in b.text and (lang is None or b.lang == lang)]
    assert len(found) == 1, f"{page.relative_to(ROOT)}: expected one block with {text!r}, found {len(found)}"
    return found[0]


def command_lines(block: Block) -> list[list[str]]:
    """The block's shell commands as argument lists: ``\\`` continuations joined, comments and prompts
    dropped (in a ``console`` block only the ``$ `` lines are commands; the rest is their output)."""
    commands, current = [], ""
    for raw in block.text.splitlines():
        line = raw
        if block.lang == "console":
            if not current and not line.startswith("$ "):
                continue
            line = line[2:] if not current else line
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        argv = shlex.split(current + line, comments=True)
        current = ""
        if argv:
            commands.append(argv)
    return commands


@dataclass(frozen=True)
class Command:
    """What one documented command runs: ``module`` (``recsys.train``, ``scripts/plan_sharding.py``, ``make``)
    with its Hydra ``overrides``, under ``nproc`` torchrun processes (0: a plain process)."""

    module: str
    overrides: list[str]
    nproc: int
    env: dict[str, str]


def parse_command(argv: list[str]) -> Command:
    """A documented command line -> the entry point it runs and its arguments.

    Understood: ``[VAR=value ...] [/usr/bin/time -v] .venv/bin/python -m MODULE | SCRIPT.py ARGS``,
    ``[VAR=value ...] .venv/bin/torchrun [options] -m MODULE ARGS`` and ``make TARGET [ARGS="..."]``.
    """
    env = {}
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
        key, value = argv[0].split("=", 1)
        env[key] = value
        argv = argv[1:]
    if argv[:2] == ["/usr/bin/time", "-v"]:
        argv = argv[2:]
    program, args = Path(argv[0]).name, argv[1:]
    if program == "make":
        target = args[0]
        extra = next((a.split("=", 1)[1] for a in args[1:] if a.startswith("ARGS=")), "")
        return Command(f"make {target}", shlex.split(extra), 0, env)
    if program in ("python", "python3"):
        if args[0] == "-m":
            return Command(args[1], args[2:], 0, env)
        return Command(args[0], args[1:], 0, env)
    if program == "torchrun":
        nproc = 1
        while args and args[0] != "-m":
            option = args.pop(0)
            if option.startswith("--nproc_per_node="):
                nproc = int(option.split("=", 1)[1])
        return Command(args[1], args[2:], nproc, env)
    raise ValueError(f"not a recsys command: {' '.join(argv)}")
