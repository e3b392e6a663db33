"""A ranker is one module plus one registration: a toy ranker registered here gets its row in the run's
results.json and in ``recsys.evaluate``'s report, and the run's and the report's rows are the same figures for
the same checkpoint (the toy's, the two-tower's and the fused ``two_tower+graph_filter``'s)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.job.run import fit
from recsys.rankers import registry
from recsys.rankers.base import EvalSplit, Fit, Point, Ranker, point_key
from recsys.rankers.registry import RANKERS, register_ranker
from recsys.ranking.retrieval import popularity_topk
from tests.helpers.config import tiny_config
from tests.helpers.entry_points import QUIET, one_error_line, run_module

TOY = "recent_popularity"


class RecentPopularityFit(Fit):
    def __init__(self, counts: np.ndarray, fit_on: str) -> None:
        self.counts, self.fit_on = counts, fit_on

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        counts = torch.from_numpy(self.counts).float()
        ids = popularity_topk(counts, split.history.num_users, k, exclude=split.history, chunk_size=chunk_size)[1]
        return {point_key(p): ids for p in points}

    def info(self) -> dict:
        return {"fit_on": self.fit_on}


class RecentPopularity(Ranker):
    """Popularity counted on the interactions the split follows (train for valid, train + valid for test), unlike
    the built-in ``popularity``'s training counts: a toy whose fit visibly depends on the split."""

    name = TOY

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        counts = np.bincount(split.graph.indices, minlength=split.graph.num_items)
        return RecentPopularityFit(counts, split.fit_on)


@pytest.fixture
def toy_ranker():
    register_ranker(TOY, lambda context, settings: RecentPopularity())
    yield TOY
    RANKERS.pop(TOY)


def test_a_registered_ranker_has_its_row_in_the_run_and_the_report(toy_ranker, tmp_path, data_root, process_group):
    run_dir = tmp_path / "run"
    rankers = f"eval.rankers=[two_tower,popularity,{toy_ranker},two_tower+graph_filter]"
    cfg = tiny_config([f"data.root={data_root}", "trainer.epochs=2", rankers])
    fit(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    results = json.loads((run_dir / "results.json").read_text())
    assert results["rankers"][toy_ranker]["fit_on"] == {"valid": "train", "test": "train + valid"}
    assert results["test"][toy_ranker]["recall@20"] > 0
    # the toy is fit on train + valid for test: it ranks otherwise than popularity's training counts
    assert results["test"][toy_ranker]["recall@20"] != results["test"]["popularity"]["recall@20"]

    rankers = [toy_ranker, "two_tower+graph_filter"]
    evaluate_run(EvaluateConfig(run_dir=str(run_dir), ann_kinds=[], ks=[10, 20], rankers=rankers))
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    for split in ("valid", "test"):
        rows = report["splits"][split]["metrics"]
        for ranker in (toy_ranker, "two_tower+graph_filter"):
            for metric in ("recall@20", "ndcg@20"):
                assert rows[ranker][metric] == pytest.approx(results[split][ranker][metric], abs=1e-6), (
                    split,
                    ranker,
                    metric,
                )
        assert rows[report["model"]]["recall@20"] == pytest.approx(results[split]["two_tower"]["recall@20"], abs=1e-6)


def test_ease_and_ials_are_rows_like_any_ranker_in_the_run_and_the_report(tmp_path, data_root, process_group):
    """eval.rankers=[two_tower,popularity,ease,ials]: all four in results.json, each tuned on valid and fit again on
    train + valid for test; recsys.evaluate's report gives the same figures for them to the last digit (one stage)."""
    run_dir = tmp_path / "run"
    settings = [
        "eval.settings.ease.lambdas=[30.0,300.0]",
        "eval.settings.ials.factors=8",
        "eval.settings.ials.iterations=4",
    ]
    cfg = tiny_config(
        [f"data.root={data_root}", "trainer.epochs=1", "eval.rankers=[two_tower,popularity,ease,ials]", *settings]
    )
    fit(cfg, run_dir)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["test"]) == {"two_tower", "popularity", "ease", "ials"}
    for name in ("ease", "ials"):
        assert results["rankers"][name]["fit_on"] == {"valid": "train", "test": "train + valid"}
        assert results["rankers"][name]["tuned_on"].startswith("valid recall@20")
    evaluate_run(EvaluateConfig(run_dir=str(run_dir), ann_kinds=[], ks=[10, 20, 50]))  # rankers=null: the run's
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    for split in ("valid", "test"):
        for name in ("ease", "ials"):
            assert report["splits"][split]["metrics"][name] == results[split][name], (split, name)
    assert report["stage"]["rankers"]["ease"]["point"] == results["rankers"]["ease"]["point"]


PLUGIN = '''
"""A plug-in module: importing it registers its ranker (what eval.plugins names)."""
import numpy as np

from recsys.rankers.registry import register_ranker
from tests.rankers.test_ranker_plugin import RecentPopularity

register_ranker("recent_popularity", lambda context, settings: RecentPopularity())
'''


def test_the_entry_points_load_a_plugin_module_named_by_eval_plugins(
    tmp_path, data_root, process_group, monkeypatch, capsys, request
):
    """Issue 43 item 15: ``eval.plugins=[module]`` imports the module before the rankers are resolved, in
    ``recsys.train`` and (from the run's config) in ``recsys.evaluate``; a module that cannot be imported is one line."""
    (tmp_path / "my_rankers.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop("my_rankers", None))  # the plug-in's import is undone with the test
    monkeypatch.setattr(registry, "RANKERS", dict(registry.ranker_specs()))  # and its registration
    run_dir = tmp_path / "run"
    args = [
        "+experiment=tiny",
        f"data.root={data_root}",
        "trainer.epochs=1",
        "eval.plugins=[my_rankers]",
        f"eval.rankers=[two_tower,popularity,{TOY}]",
        f"hydra.run.dir={run_dir}",
        *QUIET,
    ]
    assert run_module(monkeypatch, "recsys.train", args) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["test"][TOY]["recall@20"] > 0

    monkeypatch.setattr(registry, "RANKERS", {k: v for k, v in registry.RANKERS.items() if k != TOY})
    sys.modules.pop("my_rankers")  # a fresh process: the run's config names the module, evaluate imports it
    eval_args = [f"run_dir={run_dir}", "ann_kinds=[]", "ks=[10,20]", f"rankers=[{TOY}]", *QUIET]
    assert run_module(monkeypatch, "recsys.evaluate", eval_args) == 0
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["splits"]["test"]["metrics"][TOY]["recall@20"] == pytest.approx(results["test"][TOY]["recall@20"])

    capsys.readouterr()
    assert run_module(monkeypatch, "recsys.train", [*args, "eval.plugins=[no_such_rankers]", "run_name=x"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: eval.plugins: cannot import 'no_such_rankers' (ModuleNotFoundError")
