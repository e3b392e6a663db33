"""The import graph keeps its layers: the config schema imports no evaluation code, data_pipelines never imports
recsys, the serving bundle's reader needs neither torchrec nor the config (Hydra), and recsys/ has no cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """The recsys / data_pipelines modules ``path`` imports at any depth of its code (function-level included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m.split(".")[0] in ("recsys", "data_pipelines")}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_config_imports_no_evaluation_and_the_pipelines_no_recsys():
    for path in (ROOT / "recsys" / "config").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("recsys.evaluation")}, path
    for path in (ROOT / "data_pipelines").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("recsys")}, path


def test_recsys_has_no_import_cycle():
    graph = {_module(p): _imports(p) for p in (ROOT / "recsys").rglob("*.py")}
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, module, dep])
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_bundle_reader_loads_without_torchrec_or_hydra():
    code = (
        "import sys, recsys.serving.bundle; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu', 'hydra', 'omegaconf')]; "
        "print(bad); assert not bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
