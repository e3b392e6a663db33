"""per_user_metrics and the user-activity / item-popularity breakdowns, by hand and by loops."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.evaluation.breakdowns import (
    activity_breakdown,
    activity_buckets,
    breakdowns,
    popularity_breakdown,
    popularity_buckets,
)
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import compute_metrics, per_user_metrics


def _random_case(seed: int, num_users: int = 50, num_items: int = 40, kmax: int = 10):
    rng = np.random.default_rng(seed)
    topk = np.stack([rng.choice(num_items, size=kmax, replace=False) for _ in range(num_users)]).astype(np.int64)
    topk[rng.random(topk.shape) < 0.05] = -1  # a few empty slots
    pairs = rng.integers(0, [num_users, num_items], size=(250, 2))
    pairs = pairs[pairs[:, 0] != 0]  # user 0 has no relevant item
    relevant = UserItemCSR.from_pairs(pairs[:, 0], pairs[:, 1], num_users=num_users, num_items=num_items)
    return topk, relevant, rng


@pytest.mark.parametrize("seed", range(3))
def test_per_user_metrics_average_to_compute_metrics(seed):
    topk, relevant, _ = _random_case(seed)
    ks = [1, 5, 10]
    per_user = per_user_metrics(topk, relevant, ks)
    means = compute_metrics(topk, relevant, ks, num_items=40)
    for name, values in per_user.items():
        assert values.shape == (50,) and np.isnan(values[0])  # no relevant item: NaN in every metric
        assert np.nanmean(values) == pytest.approx(means[name], rel=1e-12), name


def test_activity_buckets_fixed_edges():
    bucket, labels = activity_buckets(np.array([0, 4, 5, 9, 10, 999, 1000, 5000]))
    np.testing.assert_array_equal(bucket, [0, 0, 1, 1, 2, 7, 8, 8])
    assert labels[0] == "0-4" and labels[1] == "5-9" and labels[-1] == "1000+"
    with pytest.raises(ValueError):
        activity_buckets(np.array([1]), edges=[0, 5, 5])


def test_activity_breakdown_by_hand():
    per_user = {"recall@2": np.array([1.0, 0.0, np.nan, 0.5])}
    rows = activity_breakdown(per_user, np.array([3, 7, 8, 6]), edges=[0, 5, 10])
    assert [r["bucket"] for r in rows] == ["0-4", "5-9"]  # "10+" is empty and left out
    assert rows[0]["recall@2"] == 1.0 and rows[0]["num_users"] == 1
    assert rows[1]["recall@2"] == pytest.approx(0.25)  # mean of 0.0 and 0.5; the NaN user is not evaluated
    assert rows[1]["num_users"] == 3 and rows[1]["num_users_evaluated"] == 2
    assert rows[1]["max_train_items"] == 9


def test_popularity_buckets_by_hand():
    # counts sorted desc: item 3 (50), 1 (20), 0 (10), 4 (10), 2 (5), 5 (5), 6 (0); total 100
    # before(i): 3 -> 0.00, 1 -> 0.50, 0 -> 0.70, 4 -> 0.80, 2 -> 0.90, 5 -> 0.95, 6 -> 1.00
    counts = np.array([10, 20, 5, 50, 10, 5, 0])
    np.testing.assert_array_equal(popularity_buckets(counts, head_share=0.2, tail_share=0.25), [1, 1, 2, 0, 2, 2, 2])
    np.testing.assert_array_equal(popularity_buckets(counts, head_share=0.55, tail_share=0.25), [1, 0, 2, 0, 2, 2, 2])
    with pytest.raises(ValueError):
        popularity_buckets(counts, head_share=0.6, tail_share=0.5)
    assert (popularity_buckets(np.zeros(3)) == 2).all()


def test_popularity_breakdown_by_hand():
    # buckets: item 0 head, items 1-2 torso, items 3-5 tail
    item_bucket = np.array([0, 1, 1, 2, 2, 2])
    counts = np.array([60, 15, 10, 5, 5, 5])
    topk = np.array([[0, 3, 1], [4, 5, -1]])
    relevant = UserItemCSR.from_pairs([0, 0, 0, 1, 1], [0, 2, 3, 1, 5], num_users=2, num_items=6)
    rows = {r["bucket"]: r for r in popularity_breakdown(topk, relevant, [1, 3], item_bucket, counts)}
    # head: only user 0 has a head item (0), ranked first -> 1 at k=1 and 3
    assert rows["head"]["recall@1"] == 1.0 and rows["head"]["num_users_evaluated"] == 1
    # torso: user 0 has {2} (missed), user 1 has {1} (missed) -> 0
    assert rows["torso"]["recall@3"] == 0.0 and rows["torso"]["num_relevant_pairs"] == 2
    # tail: user 0 {3} hit at rank 2, user 1 {5} hit at rank 2 -> 0 at k=1, 1 at k=3
    assert rows["tail"]["recall@1"] == 0.0 and rows["tail"]["recall@3"] == 1.0
    # top-3 slots filled: 5; head 1, torso 1, tail 3
    assert rows["head"]["topk_share@3"] == pytest.approx(1 / 5) and rows["tail"]["topk_share@3"] == pytest.approx(3 / 5)
    assert rows["head"]["train_interaction_share"] == pytest.approx(0.6) and rows["tail"]["num_items"] == 3


@pytest.mark.parametrize("seed", range(3))
def test_popularity_breakdown_against_loop(seed):
    topk, relevant, rng = _random_case(seed)
    counts = rng.integers(0, 100, size=40) ** 2
    item_bucket = popularity_buckets(counts)
    out = breakdowns(topk, relevant, [3, 10], user_train_counts=rng.integers(0, 300, size=50), item_train_counts=counts)
    rows = out["item_popularity"]["buckets"]
    for b, row in enumerate(rows):
        for k in (3, 10):
            per_user = []
            for u in range(50):
                rel_b = {i for i in relevant.row(u).tolist() if item_bucket[i] == b}
                if rel_b:
                    per_user.append(len(rel_b & set(topk[u, :k].tolist())) / len(rel_b))
            expected = np.mean(per_user) if per_user else np.nan
            np.testing.assert_allclose(row[f"recall@{k}"], expected, rtol=1e-12)
    assert sum(r["num_items"] for r in rows) == 40
    activity_users = sum(r["num_users"] for r in out["user_activity"]["buckets"])
    assert activity_users == 50
