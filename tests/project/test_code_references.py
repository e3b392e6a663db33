"""Every path to a file of this repository named in code comments, docstrings, configs and docs exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("recsys", "data_pipelines", "scripts", "tests", "conf", "docs", ".ci")
SCANNED = [*TOP[:-1], "README.md", "pyproject.toml", "Makefile", "mkdocs.yml"]
SUFFIXES = (".py", ".yaml", ".md", ".sh", ".toml", ".yml")
# a path preceded by nothing path-like, ending in a file's suffix or a folder's slash
REFERENCE = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./-]*[\w/])")
# files the docs ask a reader to create
TO_BE_WRITTEN = {"conf/experiment/my_shop.yaml"}


def _scanned_files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        else:
            yield from (p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file() and p != Path(__file__))


def _references(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        for match in REFERENCE.finditer(line):
            ref = match.group(1).rstrip(".")
            stem = Path(ref).stem
            if not (ref.endswith("/") or ref.endswith(SUFFIXES)) or stem.isupper():  # a prefix or a placeholder
                continue
            yield number, ref


def test_every_named_repository_path_exists():
    missing = [
        f"{path.relative_to(ROOT)}:{number}: {ref}"
        for path in _scanned_files()
        for number, ref in _references(path.read_text(encoding="utf-8"))
        if ref not in TO_BE_WRITTEN and not (ROOT / ref).exists()
    ]
    assert not missing, "stale references:\n" + "\n".join(missing)


def test_the_scan_finds_references_and_a_stale_one():
    found = list(_references("see recsys/data/ragged.py and tests/test_nowhere.py, scripts/NAME.py, recsys/attempt_"))
    assert [ref for _, ref in found] == ["recsys/data/ragged.py", "tests/test_nowhere.py"]
    assert sum(1 for _ in _scanned_files()) > 100
