"""The candidate's co-occurrence neighbours (``data.item_neighbors``): which items they are, that
every rank sees the same ones, and that a run with them trains, evaluates and exports end to end."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from data_pipelines.prepare import prepare_dataset
from recsys.config import query_layout
from recsys.config.fingerprint import config_fingerprint
from recsys.data.dataset import Interactions, load_dataset
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.neighbors import item_neighbors, with_item_neighbors
from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.export import ExportConfig, export_run
from recsys.rundir.config import load_run_config
from recsys.serving.bundle import load_bundle
from tests.data.test_no_categories import fit_given_split
from tests.helpers.config import tiny_config


def _interactions(pairs):
    users, items = (np.array(c, dtype=np.int64) for c in zip(*pairs))
    order = np.lexsort((items, users))
    return Interactions(users[order], items[order], np.zeros(len(pairs), dtype=np.int64))


def _lists(indptr, ids):
    return [ids[indptr[i] : indptr[i + 1]].tolist() for i in range(len(indptr) - 1)]


# u0 {0 1 2}, u1 {0 1, 1 again}, u2 {1 3}, u3 {3}; item 4 is never seen. Co-occurrence counts
# c01 = 2, c02 = c12 = c13 = 1; degrees d = (2, 3, 1, 2, 0); score c / sqrt(d_i d_j)
PAIRS = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 1), (2, 1), (2, 3), (3, 3)]


def test_neighbors_are_the_best_normalised_cooccurrences():
    train = _interactions(PAIRS)
    indptr, ids = item_neighbors(train, num_users=4, num_items=5, k=3)
    # item 1: 0 (2/sqrt 6 = .82) before 2 (1/sqrt 3 = .58) before 3 (1/sqrt 6 = .41); item 4: none
    assert _lists(indptr, ids) == [[1, 2], [0, 2, 3], [0, 1], [1], []]
    indptr, ids = item_neighbors(train, num_users=4, num_items=5, k=1)
    assert _lists(indptr, ids) == [[1], [0], [0], [1], []]
    # chunks of one item at a time (a tiny budget) give the same lists as one chunk
    small = item_neighbors(train, num_users=4, num_items=5, k=3, max_chunk_pairs=1)
    assert _lists(*small) == [[1, 2], [0, 2, 3], [0, 1], [1], []]


def test_ties_go_to_the_lower_item_id():
    train = _interactions([(0, 5), (0, 7), (1, 5), (1, 6)])  # 6 and 7 score 1/sqrt(2) for item 5
    indptr, ids = item_neighbors(train, num_users=2, num_items=8, k=2)
    assert _lists(indptr, ids)[5] == [6, 7]
    assert _lists(*item_neighbors(train, num_users=2, num_items=8, k=1))[5] == [6]


def _brute_force(train, num_users, num_items, k):
    """Each item's k best by c_ij / sqrt(d_i d_j), lower id on ties, from the dense co-occurrence matrix."""
    x = np.zeros((num_users, num_items))
    x[train.user_ids, train.item_ids] = 1.0
    cooc, degree = x.T @ x, x.sum(axis=0)
    lists = []
    for i in range(num_items):
        cols = [j for j in range(num_items) if j != i and cooc[i, j] > 0]
        cols.sort(key=lambda j: (-cooc[i, j] / np.sqrt(degree[i] * degree[j]), j))
        lists.append(cols[:k])
    return lists


@pytest.mark.parametrize("k", [1, 2, 5])
def test_long_rows_keep_exactly_the_best_k(k):
    """Rows longer than the sampled floor's 8k entries (_score_floors) sort only their contenders: the lists
    must be the brute force's, ties at the k-th score included (binary data with equal degrees ties a lot)."""
    rng = np.random.default_rng(k)
    num_users, num_items = 60, 90
    pairs = {(int(u), int(i)) for u, i in zip(rng.integers(0, num_users, 1500), rng.integers(0, num_items, 1500))}
    pairs |= {(u, 0) for u in range(num_users)} | {(u, 1) for u in range(0, num_users, 2)}  # two hub items
    train = _interactions(sorted(pairs))
    expected = _brute_force(train, num_users, num_items, k)
    assert max(len(row) for row in _brute_force(train, num_users, num_items, num_items)) > 8 * k
    for budget in (2_000_000, 50):  # one chunk, and many
        assert _lists(*item_neighbors(train, num_users, num_items, k, max_chunk_pairs=budget)) == expected


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="data.item_neighbors=0"):
        item_neighbors(_interactions(PAIRS), num_users=4, num_items=5, k=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory, process_group):
    return fit_given_split(tmp_path_factory.mktemp("neighbors"), ["data.item_neighbors=4"])


def test_candidate_rows_carry_the_neighbors_and_query_rows_none(run):
    cfg, _, _ = run
    data = with_item_neighbors(load_dataset(prepare_dataset(cfg.data)), 4)
    assert data.table_num_rows["neighbor"] == data.num_items
    builder = FeatureBuilder(data, history_length=10, user_id=False)
    items = np.array([3, 0, 3])
    batch = builder.build(
        user_ids=np.array([0, 1]),
        hist_lengths=np.array([1, 1]),
        hist_items=np.array([5, 6]),
        candidate_item_ids=items,
    )
    neighbors = batch.features["neighbor"]
    expected = [data.item_neighbor_ids[data.item_neighbor_indptr[i] : data.item_neighbor_indptr[i + 1]] for i in items]
    assert neighbors.lengths().tolist() == [0, 0] + [len(e) for e in expected]
    assert neighbors.values().tolist() == np.concatenate(expected).tolist()
    assert all(len(e) == 4 for e in expected)  # every item here shares users with more than 4 others


def test_query_rows_carry_the_history_bag_with_query_neighbors(run):
    cfg, _, _ = run
    data = with_item_neighbors(load_dataset(prepare_dataset(cfg.data)), 4)
    builder = FeatureBuilder(data, history_length=10, user_id=False, query_neighbors=True)
    batch = builder.build(
        user_ids=np.array([0, 1]),
        hist_lengths=np.array([2, 1]),
        hist_items=np.array([5, 6, 7]),
        candidate_item_ids=np.array([3]),
    )
    neighbors = batch.features["neighbor"]
    expected = data.item_neighbor_ids[data.item_neighbor_indptr[3] : data.item_neighbor_indptr[4]].tolist()
    assert neighbors.lengths().tolist() == [2, 1, len(expected)]
    assert neighbors.values().tolist() == [5, 6, 7, *expected]  # the same bag as the item key's query rows
    assert batch.features["item"].values().tolist() == [5, 6, 7, 3]
    bare = dataclasses.replace(data, item_neighbor_indptr=None, item_neighbor_ids=None)
    with pytest.raises(ValueError, match="query_neighbors needs a dataset loaded with item neighbours"):
        FeatureBuilder(bare, history_length=10, user_id=False, query_neighbors=True)


def test_query_neighbors_follow_the_neighbour_table_unless_set(tmp_path):
    assert query_layout(tiny_config()) == {"user_id": False, "sequence": False, "query_neighbors": True}
    assert not query_layout(tiny_config(["data.item_neighbors=0"]))["query_neighbors"]
    assert not query_layout(tiny_config(["model.query_neighbors=false"]))["query_neighbors"]
    no_bag = ["data.history_length=0", "model.query_user_id=true"]
    assert not query_layout(tiny_config(no_bag))["query_neighbors"]
    with pytest.raises(
        ValueError, match=r"model.query_neighbors=True: .*needs data.item_neighbors > 0.*got 0, 10, bag"
    ):
        tiny_config(["data.item_neighbors=0", "model.query_neighbors=true"])
    with pytest.raises(ValueError, match=r"model.query_neighbors=True: .*got 20, 0, bag"):
        tiny_config([*no_bag, "model.query_neighbors=true"])
    # null and true build the same model; false keeps the fingerprint of runs from before the option
    assert config_fingerprint(tiny_config()) == config_fingerprint(tiny_config(["model.query_neighbors=true"]))
    assert config_fingerprint(tiny_config()) != config_fingerprint(tiny_config(["model.query_neighbors=false"]))
    # and a run dir written before it existed loads as what it built: no neighbour bag on the query
    cfg = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(tiny_config())))
    del cfg.model["query_neighbors"]
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    assert load_run_config(tmp_path).model.query_neighbors is False


def test_a_rank_share_sees_the_whole_splits_neighbors(run):
    cfg, _, _ = run
    root = prepare_dataset(cfg.data)
    whole = with_item_neighbors(load_dataset(root), 4)
    share = with_item_neighbors(load_dataset(root, user_range=(0, 30)), 4)
    assert len(share.splits["train"]) < len(whole.splits["train"])
    assert np.array_equal(share.item_neighbor_indptr, whole.item_neighbor_indptr)
    assert np.array_equal(share.item_neighbor_ids, whole.item_neighbor_ids)


def test_trains_evaluates_and_exports_with_neighbors(run):
    cfg, run_dir, results = run
    test = results["test"]
    assert test["two_tower"]["recall@20"] > 1.5 * test["popularity"]["recall@20"]
    report = evaluate_run(EvaluateConfig(run_dir=str(run_dir), ann_kinds=["flat"], ks=[10, 20]))
    assert report is not None
    saved = json.loads((run_dir / "eval" / "report.json").read_text())
    # the offline report builds the same candidate features as training-time evaluation did
    two_tower = test["two_tower"]["recall@20"]
    assert saved["splits"]["test"]["metrics"][saved["model"]]["recall@20"] == pytest.approx(two_tower, abs=1e-6)
    bundle = load_bundle(export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(run_dir / "bundle"))))
    queries = bundle.encode(None, np.array([2, 0]), np.array([0, 6]))  # no user: a profile bag
    assert queries.shape == (2, bundle.item_embeddings.shape[1])
    two_tower_items = bundle.served.part("two_tower").items  # the fused vectors' first part
    assert torch.equal(two_tower_items, bundle.item_embeddings[:, : two_tower_items.shape[1]])
    # the item bias (the default): each vector's last column is its bias, the others a unit vector
    unit = two_tower_items[:, :-1].norm(dim=1)
    assert torch.allclose(unit, torch.ones(bundle.item_embeddings.shape[0]), atol=1e-5)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="data.item_neighbors.*-1"):
        tiny_config(["data.item_neighbors=-1"])
    with pytest.raises(ValueError, match="model.tables.neighbor"):
        tiny_config(["data.item_neighbors=3", "~model.tables.neighbor"])


def test_a_model_and_a_dataset_that_disagree_are_refused(tiny_data):
    from tests.helpers.run_task import run_task

    cfg = tiny_config()
    assert cfg.data.item_neighbors > 0 and tiny_data.has_neighbors  # the synthetic default has them
    bare = dataclasses.replace(tiny_data, item_neighbor_indptr=None, item_neighbor_ids=None)
    with pytest.raises(ValueError, match="data.item_neighbors=20 but the dataset was loaded without"):
        run_task(cfg, bare)


def test_the_bench_script_finds_the_same_lists_both_ways(tiny_data):
    """scripts/bench_item_neighbors.py times the sampled floors against sorting every co-occurrence, on a
    prepared dataset dir, and refuses to report when their lists differ."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "scripts/bench_item_neighbors.py", str(tiny_data.dir), "--k", "2", "--rounds", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["same_lists"] is True and result["k"] == 2
    assert result["items"] == tiny_data.num_items and result["floors_s"] > 0 and result["full_sort_s"] > 0
