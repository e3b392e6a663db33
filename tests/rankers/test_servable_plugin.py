"""A servable ranker added in tests/ only (tests/plugins/toy_ranker: one package, and one YAML for its settings) is
trained beside the two-tower, chosen as the served ranker, exported, loaded through the bundle's registry and serves
exactly the run's ranking; nothing in recsys/ names it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from data_pipelines.prepare import prepare_dataset
from recsys.export import ExportConfig, export_run
from recsys.job.assemble import open_dataset
from recsys.job.run import fit
from recsys.rankers.registry import RANKERS
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.served_ranking import assert_bundle_ranks_test_as_the_run

PLUGIN_CONF = Path(__file__).resolve().parents[1] / "plugins" / "conf"


@pytest.fixture
def toy_plugin():
    """The plug-in imported (it registers its ranker and its part), and unregistered afterwards."""
    import recsys.rankers.parts as parts

    module = importlib.import_module("tests.plugins.toy_ranker")
    yield module.NAME
    RANKERS.pop(module.NAME), parts._PART_TYPES.pop(module.NAME)
    sys.modules.pop("tests.plugins.toy_ranker")


def test_a_plugin_ranker_is_trained_exported_and_served_as_the_run_ranked_it(
    toy_plugin, tmp_path, data_root, process_group
):
    overrides = [
        f"data.root={data_root}",
        "trainer.epochs=1",
        f"hydra.searchpath=[file://{PLUGIN_CONF}]",
        "+eval/rankers@eval.settings.toy=toy",  # tests/plugins/conf/eval/rankers/toy.yaml
        "eval.rankers=[two_tower,popularity,toy]",
        "eval.serve=toy",
    ]
    cfg = tiny_config(overrides)
    assert cfg.eval.settings["toy"] == {"dim": 16, "seed": 3}
    run_dir = tmp_path / "run"
    results = fit(cfg, run_dir)
    assert results["headline"]["ranker"] == "toy" and results["rankers"]["toy"]["settings"] == {"dim": 16, "seed": 3}
    assert results["test"]["toy"]["recall@20"] > 0

    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert [p["ranker"] for p in manifest["served"]["parts"]] == ["toy"]
    data = open_dataset(cfg, prepare_dataset(cfg.data))
    assert_bundle_ranks_test_as_the_run(load_bundle(bundle_dir), run_dir, cfg, data)
    assert toy_plugin in RANKERS


def _unregister(name: str) -> None:
    import recsys.rankers.parts as parts

    RANKERS.pop(name, None), parts._PART_TYPES.pop(name, None)
    sys.modules.pop("tests.plugins.toy_ranker", None)


def test_export_imports_the_runs_plugins(tmp_path, data_root, process_group):
    """recsys.export in a process that never imported the plug-in (issue 53 finding 4): it imports the run's
    eval.plugins, as train and evaluate do, instead of failing on an unregistered part."""
    overrides = [
        f"data.root={data_root}",
        "trainer.epochs=1",
        f"hydra.searchpath=[file://{PLUGIN_CONF}]",
        "+eval/rankers@eval.settings.toy=toy",
        "eval.plugins=[tests.plugins.toy_ranker]",  # fit imports it, as recsys.train does
        "eval.rankers=[two_tower,popularity,toy]",
        "eval.serve=toy",
    ]
    run_dir = tmp_path / "run"
    try:
        fit(tiny_config(overrides), run_dir)
    finally:
        _unregister("toy")  # what a fresh export process starts from
    try:
        bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
        manifest = json.loads((bundle_dir / "manifest.json").read_text())
        assert [p["ranker"] for p in manifest["served"]["parts"]] == ["toy"]
    finally:
        _unregister("toy")
