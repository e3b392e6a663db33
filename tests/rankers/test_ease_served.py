"""EASE served (issue 44 item 3): its fit is a dot product (the binary history times B's columns) that ranks as the
sparse baseline does, is fused with the two-tower on valid, exported, and the bundle recommends exactly what the run
measured; a catalogue above eval.settings.ease.max_served_items is refused before training when it would be served."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_pipelines.errors import ConfigError
from data_pipelines.prepare import prepare_dataset
from recsys.export import ExportConfig, export_run
from recsys.job.assemble import open_dataset
from recsys.job.run import fit
from recsys.rankers.base import EvalSplit
from recsys.rankers.ease.ranker import EaseRanker
from recsys.rankers.ease.settings import EaseSettings
from recsys.rankers.ease.solve import ease_from_gram, ease_topk, gram_matrix
from recsys.rankers.parts import Catalogue, Query
from recsys.rankers.points import point_key
from recsys.rankers.served import Served
from recsys.ranking.interactions import UserItemCSR
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.served_ranking import assert_bundle_ranks_test_as_the_run

FUSED = "two_tower+ease"


def _split(num_users: int = 60, num_items: int = 40, seed: int = 0) -> EvalSplit:
    rng = np.random.default_rng(seed)
    dense = rng.random((num_users, num_items)) < 0.15
    dense[:, 0] = True  # a popular item, so that histories overlap
    indptr = np.concatenate([[0], np.cumsum(dense.sum(1))]).astype(np.int64)
    csr = UserItemCSR(indptr, np.nonzero(dense)[1].astype(np.int64), num_items)
    held = UserItemCSR(np.arange(num_users + 1, dtype=np.int64), rng.integers(0, num_items, num_users), num_items)
    return EvalSplit("test", np.arange(num_users), csr, csr, held, ("train",))


def test_the_served_ease_ranks_as_the_sparse_baseline_and_its_part_encodes_the_history(tmp_path):
    split = _split()
    ranker = EaseRanker(EaseSettings(lambdas=[3.0, 30.0]), num_items=40)
    fit_ = ranker.fit(split, {})
    grid = fit_.topk(split, 10, ranker.grid(), chunk_size=16)  # the grid: ease_topk's sparse product
    for point in ranker.grid():
        single = fit_.topk(split, 10, [point], chunk_size=16)[point_key(point)]  # the bundle's math
        b = ease_from_gram(gram_matrix(split.graph, dtype=torch.float64), point["lambda"])
        expected = ease_topk(b, split.history, 10, exclude=split.history, chunk_size=16)[1]
        assert torch.equal(single, expected) and torch.equal(grid[point_key(point)], expected)

    served = fit_.served({"lambda": 30.0})
    loaded = Served.load(tmp_path, served.save(tmp_path), "served.json")
    catalogue = Catalogue(4, 40, np.zeros(41, np.int64), np.zeros(0, np.int64))
    query = Query(None, np.array([3, 0, 2]), np.array([1, 5, 1, 7, -1]))  # a repeat, an empty one, an unknown item
    rows = loaded.encode(query, catalogue)
    assert rows.shape == (3, 40) and rows.sum().item() == 3.0 and rows[0, 1] == rows[0, 5] == rows[2, 7] == 1.0
    b = ease_from_gram(gram_matrix(split.graph, dtype=torch.float64), 30.0)
    torch.testing.assert_close(rows @ loaded.items().t(), rows @ b)  # x_u B: the baseline's scores


def test_a_catalogue_above_the_served_cap_is_ranked_but_not_servable():
    split = _split()
    fit_ = EaseRanker(EaseSettings(lambdas=[30.0], max_served_items=39), num_items=40).fit(split, {})
    assert not EaseRanker(EaseSettings(max_served_items=39), num_items=40).servable
    assert fit_.topk(split, 10, [{"lambda": 30.0}], chunk_size=16)["lambda=30"].shape == (60, 10)
    with pytest.raises(ValueError, match=r"max_served_items=39: EASE over 40 items is not served"):
        fit_.served({"lambda": 30.0})


def test_two_tower_fused_with_ease_is_chosen_on_valid_exported_and_served_as_the_run_ranked_it(
    tmp_path, data_root, process_group
):
    overrides = [
        f"data.root={data_root}",
        "trainer.epochs=1",
        f"eval.rankers=[two_tower,popularity,ease,{FUSED}]",
        "eval.settings.ease.lambdas=[30.0,300.0]",
        "eval.settings.fusion.betas=[0.0,0.5,2.0]",
        f"eval.serve={FUSED}",
    ]
    cfg = tiny_config(overrides)
    run_dir = tmp_path / "run"
    results = fit(cfg, run_dir)
    row = results["rankers"][FUSED]
    assert results["headline"]["ranker"] == FUSED and row["servable"]
    assert len(row["grid"]) == 1 + 2 * 2  # beta 0 once, then each λ with each beta > 0
    assert max(row["grid"].values()) == results["valid"][FUSED]["recall@20"]
    assert results["valid"][FUSED]["recall@20"] >= results["valid"]["two_tower"]["recall@20"]  # beta = 0 is on the grid

    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    data = open_dataset(cfg, prepare_dataset(cfg.data))
    assert [(p["ranker"], p["dim"]) for p in manifest["served"]["parts"]] == [
        ("two_tower", cfg.model.tower_dims[-1]),
        ("ease", data.num_items),
    ]
    assert manifest["served"]["weights"] == [1.0, row["point"]["beta"]]
    assert_bundle_ranks_test_as_the_run(load_bundle(bundle_dir), run_dir, cfg, data)


def test_fusing_ease_over_more_items_than_it_serves_is_refused_before_training(tmp_path, data_root, process_group):
    cfg = tiny_config(
        [f"data.root={data_root}", f"eval.rankers=[two_tower,{FUSED}]", "eval.settings.ease.max_served_items=10"]
    )
    with pytest.raises(
        ConfigError, match=r"eval.settings.ease.max_served_items=10: EASE over [\d,]+ items is not served"
    ):
        fit(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "overrides, fused",
    [
        ([], True),  # tiny: recbole's random split, a profile-bag query, neighbours on
        (["data.item_neighbors=0"], True),  # the synthetic default's shape: the fusions do not need the neighbours
        (["data.protocol=strong_generalization"], True),  # held-out users, their profiles folded in
        (["data.protocol=loo"], False),  # the next item in time: the recent items, not the profile
        (["data.query_history=recent"], False),
        (["model.id_mapping=managed"], False),
    ],
)
def test_the_default_list_fuses_where_the_query_is_the_users_profile(overrides, fused):
    """eval.rankers=null: the fusions join the two-tower and popularity wherever the query is a profile bag (the
    random-split protocols, whose held-out items lie anywhere in the profile: the graph filter's and EASE's own
    setting), whether or not the candidates' neighbours are on; EASE's only up to DEFAULT_EASE_MAX_ITEMS items."""
    from recsys.job.ranker_choice import resolved_rankers
    from recsys.rankers.registry import DEFAULT_EASE_MAX_ITEMS, DEFAULT_FUSION, EASE_FUSION

    cfg = tiny_config(overrides)
    both = ["two_tower", "popularity", DEFAULT_FUSION, EASE_FUSION]
    assert resolved_rankers(cfg, 300) == (both if fused else ["two_tower", "popularity"])
    wide = resolved_rankers(cfg, DEFAULT_EASE_MAX_ITEMS + 1)
    assert wide == (["two_tower", "popularity", DEFAULT_FUSION] if fused else ["two_tower", "popularity"])
