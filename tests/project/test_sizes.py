"""The code stays small-grained where a maintainer reads it: recsys/ holds its entry points and packages (at most 8
loose modules), no file of recsys/ is over 400 lines and no function over 60 (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_LOOSE_MODULES = 400, 60, 8


def test_recsys_holds_entry_points_and_packages():
    loose = sorted(p.name for p in (ROOT / "recsys").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert {"train.py", "evaluate.py", "export.py"} <= set(loose)


def test_no_file_over_400_lines_and_no_function_over_60():
    long_files, long_functions = [], []
    for path in sorted((ROOT / "recsys").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}::{node.name}: {lines} lines")
    assert not long_files and not long_functions, long_files + long_functions


def test_the_tests_mirror_the_packages():
    """Each package of recsys/ has its tests in the folder of the same name under tests/ (docs/architecture.md)."""
    packages = sorted(p.name for p in (ROOT / "recsys").iterdir() if (p / "__init__.py").is_file())
    missing = [name for name in packages if not any((ROOT / "tests" / name).glob("test_*.py"))]
    assert missing == [], f"packages of recsys/ without a tests/<package>/test_*.py: {missing}"
    assert {"job", "training", "rankers", "ranking"} <= set(packages)
