"""The served ranker's parts (recsys/rankers/parts.py, served.py): saved and loaded back by name, fused as the
evaluation fuses them, an unknown part named with its file, and a run dir written before parts still exported."""

import json

import numpy as np
import pytest
import torch

from recsys.rankers.graph_filter.part import GraphFilterPart
from recsys.rankers.parts import Catalogue, Query, part_type
from recsys.rankers.served import Served
from recsys.rankers.served_dir import load_served
from recsys.rankers.spread import fuse_queries, item_covariance
from recsys.rankers.two_tower.part import TwoTowerPart

CATALOGUE = Catalogue(
    num_users=4, num_items=6, category_indptr=np.zeros(7, np.int64), category_ids=np.zeros(0, np.int64)
)
QUERY = Query(None, np.array([2, 1, 0]), np.array([0, 3, 5]))


def _graph_part(seed: int = 0) -> GraphFilterPart:
    g = torch.Generator().manual_seed(seed)
    return GraphFilterPart(torch.randn(6, 3, generator=g), query_table=torch.randn(6, 3, generator=g))


def test_a_fused_ranker_round_trips_and_fuses_as_the_evaluation_does(tmp_path):
    first, second = _graph_part(0), _graph_part(1)
    served = Served([first, second], [1.0, 0.3])
    meta = served.save(tmp_path)
    assert [e["ranker"] for e in meta["parts"]] == ["graph_filter", "graph_filter"] and meta["weights"] == [1.0, 0.3]
    loaded = Served.load(tmp_path, json.loads(json.dumps(meta)), "served.json")
    torch.testing.assert_close(loaded.items(), torch.cat([first.items, second.items], dim=1))
    expected = fuse_queries(
        [first.encode(QUERY, CATALOGUE), second.encode(QUERY, CATALOGUE)],
        [item_covariance(first.items), item_covariance(second.items)],
        [1.0, 0.3],
    )
    torch.testing.assert_close(loaded.encode(QUERY, CATALOGUE), expected)
    assert loaded.encode(QUERY, CATALOGUE)[2].abs().sum() == 0  # an empty history: a zero query


def test_an_unknown_part_is_named_with_its_manifest():
    with pytest.raises(ValueError, match=r"bundle/manifest.json: no servable part 'mine' is registered .*import it"):
        part_type("mine", "bundle/manifest.json")


def test_a_run_dir_from_before_parts_is_read_into_parts(tmp_path):
    """served/ as runs wrote it: vectors.pt with the two-tower's columns first, the graph filter's after."""
    g = torch.Generator().manual_seed(2)
    tt, gf, query_table = torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    root = tmp_path / "served"
    root.mkdir()
    torch.save(
        {
            "item_vectors": torch.cat([tt, gf], dim=1),
            "graph_query": query_table,
            "covariance.two_tower": item_covariance(tt),
            "covariance.graph_filter": item_covariance(gf),
        },
        root / "vectors.pt",
    )
    meta = {"ranker": "two_tower+graph_filter", "point": {"beta": 0.1}, "point_key": "beta=0.1"}
    (root / "served.json").write_text(json.dumps({**meta, "two_tower_dim": 4, "graph_dim": 3, "beta": 0.1}))
    served, _ = load_served(tmp_path)
    assert [type(p) for p in served.parts] == [TwoTowerPart, GraphFilterPart] and served.weights == [1.0, 0.1]
    torch.testing.assert_close(served.items(), torch.cat([tt, gf], dim=1))
    torch.testing.assert_close(served.parts[1].query_table, query_table)
    torch.testing.assert_close(served.covariances[0], item_covariance(tt))
