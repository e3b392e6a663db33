"""Built-in rankers register themselves, once, in their packages (recsys/rankers/<name>/spec.py and part.py, found by
recsys/rankers/builtin.py): no list elsewhere names them. A new built-in ranker is one package: dropped into
recsys/rankers/, it is ranked in results.json, in recsys.evaluate's report, and served by the bundle."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import recsys.rankers.parts as parts
from data_pipelines.prepare import prepare_dataset
from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.export import ExportConfig, export_run
from recsys.job.assemble import open_dataset
from recsys.job.run import fit
from recsys.rankers import registry
from recsys.rankers.builtin import builtin_modules
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.served_ranking import assert_bundle_ranks_test_as_the_run

ROOT = Path(__file__).resolve().parents[2]
TOY_SOURCE = ROOT / "tests" / "plugins" / "toy_ranker" / "__init__.py"  # a servable ranker in one module
NEW = "zz_new_builtin"  # the package the test adds under recsys/rankers/ and removes
NAME = "new_builtin"
BUILTINS = ["ease", "graph_filter", "ials", "plain_two_tower", "popularity", "two_tower"]


def test_the_built_in_packages_register_their_rankers_and_parts():
    assert [m.split(".")[2] for m in builtin_modules("spec")] == BUILTINS
    assert [m.split(".")[2] for m in builtin_modules("part")] == ["ease", "graph_filter", "two_tower"]
    assert set(registry.ranker_specs()) >= set(BUILTINS)
    assert {r for r in ("ease", "graph_filter", "two_tower", "ials", "popularity") if parts.servable(r)} == {
        "ease",
        "graph_filter",
        "two_tower",
    }


@pytest.fixture
def new_package(monkeypatch):
    """A servable ranker added as a package of recsys/rankers/ (its spec.py registers it, its part.py its part), found
    again by a fresh discovery; removed afterwards with its registrations."""
    package = ROOT / "recsys" / "rankers" / NEW
    shutil.rmtree(package, ignore_errors=True)  # a run killed mid-test left one
    package.mkdir()
    try:
        (package / "__init__.py").write_text('"""A built-in ranker added by tests/rankers/test_builtin.py."""\n')
        (package / "spec.py").write_text(TOY_SOURCE.read_text().replace('NAME = "toy"', f'NAME = "{NAME}"'))
        (package / "part.py").write_text(f"from recsys.rankers.{NEW}.spec import ToyPart  # noqa: F401\n")
        # the registry as a fresh process finds it: the built-ins (imported already) and the new package
        monkeypatch.setattr(registry, "RANKERS", dict(registry.ranker_specs()))
        monkeypatch.setattr(registry, "_builtins_imported", False)
        yield NAME
    finally:
        shutil.rmtree(package, ignore_errors=True)
        parts._PART_TYPES.pop(NAME, None)
        for module in [m for m in sys.modules if m.startswith(f"recsys.rankers.{NEW}")]:
            sys.modules.pop(module)


def test_a_new_built_in_ranker_is_one_package(new_package, tmp_path, data_root, process_group):
    overrides = [f"data.root={data_root}", "trainer.epochs=1", f"eval.rankers=[two_tower,popularity,{NAME}]"]
    cfg = tiny_config([*overrides, f"eval.serve={NAME}"])
    run_dir = tmp_path / "run"
    results = fit(cfg, run_dir)
    assert results["headline"]["ranker"] == NAME
    assert results["rankers"][NAME]["settings"] == {"dim": 32, "seed": 0}  # its dataclass's defaults
    assert results["test"][NAME]["recall@20"] > 0

    evaluate_run(EvaluateConfig(run_dir=str(run_dir), ann_kinds=[], ks=[10, 20], rankers=[NAME]))
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    row = report["splits"]["test"]["metrics"][NAME]
    assert row["recall@20"] == pytest.approx(results["test"][NAME]["recall@20"], abs=1e-6)
    assert report["stage"]["rankers"][NAME]["settings"] == results["rankers"][NAME]["settings"]
    assert f"### {NAME}\n" in (run_dir / "eval" / "report.md").read_text()  # its own section, with no report edit

    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert [p["ranker"] for p in manifest["served"]["parts"]] == [NAME]
    data = open_dataset(cfg, prepare_dataset(cfg.data))
    assert_bundle_ranks_test_as_the_run(load_bundle(bundle_dir), run_dir, cfg, data)
