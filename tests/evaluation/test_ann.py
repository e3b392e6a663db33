"""FAISS indexes: exclusion semantics, flat recall vs exact = 1, IVF / HNSW recall on clustered data."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

from recsys.evaluation.ann import AnnParams, ann_topk, build_index, compare_ann, recall_vs_exact, require_faiss  # noqa: E402
from recsys.ranking.interactions import UserItemCSR  # noqa: E402
from recsys.ranking.retrieval import exact_topk  # noqa: E402


def _clustered(seed: int, num_items: int = 3000, num_users: int = 400, dim: int = 16, num_clusters: int = 30):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((num_clusters, dim)) * 3
    items = centers[rng.integers(0, num_clusters, num_items)] + 0.5 * rng.standard_normal((num_items, dim))
    users = centers[rng.integers(0, num_clusters, num_users)] + 0.5 * rng.standard_normal((num_users, dim))
    history = rng.integers(0, 60, size=num_users)  # some users with many excluded items
    exclude = UserItemCSR.from_pairs(
        np.repeat(np.arange(num_users), history),
        rng.integers(0, num_items, size=history.sum()),
        num_users=num_users,
        num_items=num_items,
    )
    return items.astype(np.float32), users.astype(np.float32), exclude


def test_flat_index_equals_exact_with_exclusions():
    items, users, exclude = _clustered(0)
    _, exact_ids = exact_topk(torch.from_numpy(users), torch.from_numpy(items), 25, exclude=exclude)
    scores, ids = ann_topk(build_index(items, "flat"), users, 25, exclude=exclude, batch_size=64)
    assert recall_vs_exact(ids, exact_ids.numpy()) == 1.0
    np.testing.assert_array_equal(ids, exact_ids.numpy())
    assert scores.shape == ids.shape == (400, 25) and (np.diff(scores, axis=1) <= 0).all()
    for u in range(users.shape[0]):
        assert not set(ids[u].tolist()) & set(exclude.row(u).tolist())


def test_padding_when_few_items_remain():
    items = np.eye(4, dtype=np.float32)
    users = np.ones((2, 4), dtype=np.float32)
    exclude = UserItemCSR.from_pairs([0, 0, 0], [0, 1, 2], num_users=2, num_items=4)
    scores, ids = ann_topk(build_index(items, "flat"), users, 3, exclude=exclude)
    np.testing.assert_array_equal(ids, [[3, -1, -1], [0, 1, 2]])  # ties ordered by id
    assert np.isneginf(scores[0, 1:]).all()


def test_compare_ann_reports_recall_and_latency():
    items, users, exclude = _clustered(1)
    summary, ids = compare_ann(items, users, 20, exclude=exclude, params=AnnParams(nprobe=8), latency_sample=20)
    assert summary["indexes"]["flat"]["recall_vs_exact"] == 1.0
    for kind in ("ivf_flat", "hnsw"):
        recall = summary["indexes"][kind]["recall_vs_exact"]
        assert 0.5 < recall <= 1.0, (kind, recall)
        assert ids[kind].shape == (400, 20)
    for entry in [summary["exact"], *summary["indexes"].values()]:
        assert entry["search_s"] > 0 and entry["users_per_s"] > 0
        assert entry["ms_per_query"] == pytest.approx(entry["search_s"] * 1e3 / 400)
        assert entry["single_query_ms"] > 0


def test_recall_vs_exact_by_hand():
    exact = np.array([[1, 2, 3], [4, 5, -1], [-1, -1, -1]])
    approx = np.array([[3, 9, 1], [6, 7, 8], [0, 1, 2]])
    assert recall_vs_exact(approx, exact) == pytest.approx((2 / 3 + 0 / 2) / 2)  # user 2 has no exact ids


def test_missing_faiss_gives_install_hint(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("No module named 'faiss'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        require_faiss()


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown ANN index kind"):
        build_index(np.zeros((5, 2), dtype=np.float32), "lsh")


def test_ivf_nprobe_sweep_recall_grows_to_exhaustive():
    """More lists scanned is a superset of candidates: recall never falls, and nprobe = nlist is exact."""
    items, users, exclude = _clustered(2)
    params = AnnParams(nlist=16, nprobe=2, nprobe_sweep=(1, 2, 4, 8, 64))
    summary, _ = compare_ann(items, users, 20, exclude=exclude, kinds=["ivf_flat"], params=params, latency_sample=5)
    entry = summary["indexes"]["ivf_flat"]
    sweep = entry["nprobe_sweep"]
    assert [p["nprobe"] for p in sweep] == [1, 2, 4, 8, 16]  # 64 capped at nlist
    recalls = [p["recall_vs_exact"] for p in sweep]
    assert recalls == sorted(recalls) and recalls[0] < 1.0 and recalls[-1] == pytest.approx(1.0)
    assert sweep[1]["recall_vs_exact"] == pytest.approx(entry["recall_vs_exact"])  # nprobe=2, the configured one
    assert entry["params"]["nprobe"] == 2  # the index was put back
