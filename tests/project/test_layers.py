"""The import graph keeps its layers: the config schema imports no evaluation code, data_pipelines never imports
recsys, the serving bundle's reader needs neither torchrec nor the config (Hydra), recsys/ has no cycle between its
modules nor between its folders, and the rankers stand on the ranking layer, not on the evaluation stage above them."""

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


def _folder(module: str) -> str:
    """recsys.<folder>.… -> <folder>; a loose module of recsys/ is its own folder (recsys.train -> train)."""
    return module.split(".")[1]


def test_no_folder_of_recsys_imports_one_that_imports_it():
    """Between folders the imports go one way: a folder whose modules import another's, and are imported by it, would
    be one layer in two places (docs/architecture.md draws the layers)."""
    edges: dict[str, set[str]] = {}
    for path in (ROOT / "recsys").rglob("*.py"):
        source = _module(path)
        if source == "recsys":
            continue
        for target in _imports(path):
            if target.startswith("recsys.") and _folder(target) != _folder(source):
                edges.setdefault(_folder(source), set()).add(_folder(target))
    both_ways = sorted(
        {tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if a in edges.get(b, ())}
    )
    assert not both_ways, f"folders importing each other: {both_ways}"
    assert len(edges) >= 10  # the walk saw the folders (a test that cannot fail would pass on an empty graph)


def test_the_rankers_stand_on_the_ranking_layer_not_on_the_evaluation_stage():
    for path in (ROOT / "recsys" / "rankers").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("recsys.evaluation")}, path
    for path in (ROOT / "recsys" / "ranking").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith(("recsys.rankers", "recsys.evaluation"))}, path


def _string_literals(path: Path) -> set[str]:
    """The string constants of ``path``'s code, docstrings left out (they may name what they describe)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_the_report_names_no_ranker():
    """The report iterates the rankers the stage ranked and labels each by its package: adding a ranker edits nothing
    in report/ (issue 54)."""
    from recsys.rankers.registry import ranker_specs

    names = {name for name in ranker_specs() if name != "two_tower"}  # the trained model's row: TRAINED, imported
    named = {
        str(path.relative_to(ROOT)): sorted(_string_literals(path) & names)
        for path in sorted((ROOT / "recsys" / "evaluation" / "report").rglob("*.py"))
    }
    assert {path: found for path, found in named.items() if found} == {}
    assert {"ease", "ials", "graph_filter", "popularity"} <= names  # the check knows the built-in names


# the evaluation stage and the layers under it take their own config sections and the run plan's decisions
# (recsys/job/plan.py), never the root Config (shared/STYLE.md 18-19)
SECTION_LAYERS = (
    "components", "data", "distributed", "evaluation", "model", "rankers", "ranking", "serving", "training",
)  # fmt: skip


def _names_root_config(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("recsys.config"):
            if any(alias.name == "Config" for alias in node.names):
                return True
    return False


def test_the_layers_below_the_stage_never_take_the_root_config():
    offenders = [
        str(path.relative_to(ROOT))
        for layer in SECTION_LAYERS
        for path in sorted((ROOT / "recsys" / layer).rglob("*.py"))
        if _names_root_config(path)
    ]
    assert offenders == []
    # the check sees an import of the root Config (a module that takes it is named)
    assert _names_root_config(ROOT / "recsys" / "job" / "plan.py")


def test_the_bundle_reader_loads_without_torchrec_or_hydra():
    code = (
        "import sys, recsys.serving.bundle; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu', 'hydra', 'omegaconf')]; "
        "print(bad); assert not bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


ASSEMBLY = ("config", "job", "tune")  # the schemas, the run's assembly and the search over runs


def _takes_root_config(path: Path) -> list[str]:
    """The functions of ``path`` with a parameter annotated ``Config``, the root schema (imported from recsys.config;
    a component's own ``Config`` is not it)."""
    out = []
    tree = ast.parse(path.read_text())
    if not _names_root_config(path) and not path.is_relative_to(ROOT / "recsys" / "config"):
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(isinstance(a.annotation, ast.Name) and a.annotation.id == "Config" for a in args):
                out.append(f"{path.relative_to(ROOT)}::{node.name}")
    return out


def test_the_root_config_is_a_parameter_only_in_the_entry_points_and_the_runs_assembly():
    offenders = [
        name
        for path in sorted((ROOT / "recsys").rglob("*.py"))
        if path.parent != ROOT / "recsys" and path.relative_to(ROOT / "recsys").parts[0] not in ASSEMBLY
        for name in _takes_root_config(path)
    ]
    assert offenders == []
    assert _takes_root_config(ROOT / "recsys" / "job" / "plan.py")  # the check sees one
