"""Metrics and UserItemCSR: hand-worked cases and brute-force loop references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recsys.ranking.interactions import UserItemCSR, sorted_unique
from recsys.ranking.metrics import (
    compute_metrics,
    hit_matrix,
    hit_rate_at_k,
    item_coverage_at_k,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    recall_liang_at_k,
)

# ---------------------------------------------------------------------------------------------
# Hand-built case: 4 users, 6 items, Kmax = 4.
#
#   user  top-4 ids        relevant    hits
#   0     [3, 1, 4, 0]     {0, 1, 5}   [F, T, F, T]
#   1     [2, 5, -1, -1]   {2}         [T, F, F, F]   (two empty slots)
#   2     [0, 1, 2, 3]     {}          [F, F, F, F]   (no relevant item: left out of averages)
#   3     [4, 5, 1, 2]     {0, 3}      [F, F, F, F]
#
# d(j) = 1 / log2(j + 2): d0 = 1, d1 = 0.6309298, d2 = 0.5, d3 = 0.4306766
#
# user 0 (3 relevant):
#   k=1: 0 hits -> recall 0, liang 0, ndcg 0, hit 0, mrr 0
#   k=2: 1 hit  -> recall 1/3, liang 1/min(2,3) = 1/2,
#                  ndcg = d1 / (d0 + d1) = 0.6309298 / 1.6309298 = 0.3868528, hit 1, mrr 1/2
#   k=4: 2 hits -> recall 2/3, liang 2/min(4,3) = 2/3,
#                  ndcg = (d1 + d3) / (d0 + d1 + d2) = 1.0616063 / 2.1309298 = 0.4981893, hit 1, mrr 1/2
# user 1 (1 relevant, hit at rank 1): every metric 1 at every k.
# user 3 (2 relevant, no hit): every metric 0.
# Means over users {0, 1, 3}:
#   k=1: recall 1/3, liang 1/3, ndcg 1/3, hit 1/3, mrr 1/3
#   k=2: recall (1/3 + 1)/3 = 4/9, liang (1/2 + 1)/3 = 1/2, ndcg (0.3868528 + 1)/3 = 0.4622843,
#        hit 2/3, mrr (1/2 + 1)/3 = 1/2
#   k=4: recall (2/3 + 1)/3 = 5/9, liang 5/9, ndcg (0.4981893 + 1)/3 = 0.4993964, hit 2/3, mrr 1/2
# Coverage over evaluated users {0, 1, 3}:
#   k=1: {3, 2, 4} -> 3/6;  k=2: {3, 1, 2, 5, 4} -> 5/6;  k=4: all six -> 1
# Coverage over all four users (item_coverage_at_k on the whole matrix):
#   k=1: {3, 2, 0, 4} -> 4/6;  k=2: {3, 1, 2, 5, 0, 4} -> 1
# ---------------------------------------------------------------------------------------------

TOPK = np.array([[3, 1, 4, 0], [2, 5, -1, -1], [0, 1, 2, 3], [4, 5, 1, 2]], dtype=np.int64)
RELEVANT = UserItemCSR.from_pairs(np.array([0, 0, 0, 1, 3, 3]), np.array([5, 1, 0, 2, 3, 0]), num_users=4, num_items=6)
HITS = np.array([[False, True, False, True], [True, False, False, False], [False] * 4, [False] * 4])
NREL = np.array([3, 1, 0, 2])
NAN = float("nan")


def test_hand_hit_matrix():
    np.testing.assert_array_equal(hit_matrix(TOPK, RELEVANT), HITS)


@pytest.mark.parametrize(
    "fn, k, expected",
    [
        (recall_at_k, 1, [0, 1, NAN, 0]),
        (recall_at_k, 2, [1 / 3, 1, NAN, 0]),
        (recall_at_k, 4, [2 / 3, 1, NAN, 0]),
        (recall_liang_at_k, 1, [0, 1, NAN, 0]),
        (recall_liang_at_k, 2, [1 / 2, 1, NAN, 0]),
        (recall_liang_at_k, 4, [2 / 3, 1, NAN, 0]),
        (ndcg_at_k, 1, [0, 1, NAN, 0]),
        (ndcg_at_k, 2, [0.3868528, 1, NAN, 0]),
        (ndcg_at_k, 4, [0.4981893, 1, NAN, 0]),
    ],
)
def test_hand_relevance_normalised(fn, k, expected):
    np.testing.assert_allclose(fn(HITS, NREL, k), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "fn, k, expected",
    [
        (hit_rate_at_k, 1, [0, 1, 0, 0]),
        (hit_rate_at_k, 2, [1, 1, 0, 0]),
        (hit_rate_at_k, 4, [1, 1, 0, 0]),
        (mrr_at_k, 1, [0, 1, 0, 0]),
        (mrr_at_k, 2, [0.5, 1, 0, 0]),
        (mrr_at_k, 4, [0.5, 1, 0, 0]),
    ],
)
def test_hand_rank_only(fn, k, expected):
    np.testing.assert_allclose(fn(HITS, k), expected)


def test_hand_coverage():
    assert item_coverage_at_k(TOPK, 1, 6) == pytest.approx(4 / 6)
    assert item_coverage_at_k(TOPK, 2, 6) == pytest.approx(1.0)
    # empty slots are not items: user 1 alone covers {2, 5}
    assert item_coverage_at_k(TOPK[1:2], 4, 6) == pytest.approx(2 / 6)


def test_hand_compute_metrics():
    m = compute_metrics(TOPK, RELEVANT, [1, 2, 4], num_items=6)
    expected = {
        "recall@1": 1 / 3, "recall_liang@1": 1 / 3, "ndcg@1": 1 / 3, "hit_rate@1": 1 / 3, "mrr@1": 1 / 3,
        "coverage@1": 3 / 6,
        "recall@2": 4 / 9, "recall_liang@2": 1 / 2, "ndcg@2": 0.4622843, "hit_rate@2": 2 / 3, "mrr@2": 1 / 2,
        "coverage@2": 5 / 6,
        "recall@4": 5 / 9, "recall_liang@4": 5 / 9, "ndcg@4": 0.4993964, "hit_rate@4": 2 / 3, "mrr@4": 1 / 2,
        "coverage@4": 1.0,
        "num_users_evaluated": 3,
    }  # fmt: skip
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-6), key


def test_k_beyond_ranked_slots_raises():
    with pytest.raises(ValueError):
        recall_at_k(HITS, NREL, 5)
    with pytest.raises(ValueError):
        compute_metrics(TOPK, RELEVANT, [5], num_items=6)


def test_hit_matrix_rejects_out_of_range_ids():
    with pytest.raises(ValueError):
        hit_matrix(np.array([[6]] * 4), RELEVANT)


# ---------------------------------------------------------------------------------------------
# Brute-force references: one Python loop per user, straight from the formulas.
# ---------------------------------------------------------------------------------------------


def _random_case(seed: int, num_users: int = 40, num_items: int = 30, kmax: int = 12):
    rng = np.random.default_rng(seed)
    topk = np.full((num_users, kmax), -1, dtype=np.int64)
    for u in range(num_users):
        n = rng.integers(0, kmax + 1)  # some rows padded with -1
        topk[u, :n] = rng.choice(num_items, size=n, replace=False)
    pairs = rng.integers(0, [num_users, num_items], size=(200, 2))
    pairs = pairs[pairs[:, 0] != 0]  # user 0 has no relevant item
    relevant = UserItemCSR.from_pairs(pairs[:, 0], pairs[:, 1], num_users=num_users, num_items=num_items)
    return topk, relevant


def _loop_reference(topk, relevant, k, num_items):
    per_user = {name: [] for name in ("recall", "recall_liang", "ndcg", "hit_rate", "mrr")}
    covered = set()
    for u in range(topk.shape[0]):
        rel = set(relevant.row(u).tolist())
        if not rel:
            continue
        ranked = [int(i) for i in topk[u, :k]]
        covered.update(i for i in ranked if i >= 0)
        hits = [i >= 0 and i in rel for i in ranked]
        n_hits = sum(hits)
        per_user["recall"].append(n_hits / len(rel))
        per_user["recall_liang"].append(n_hits / min(k, len(rel)))
        dcg = sum(1 / math.log2(j + 2) for j, h in enumerate(hits) if h)
        idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(rel))))
        per_user["ndcg"].append(dcg / idcg)
        per_user["hit_rate"].append(float(n_hits > 0))
        per_user["mrr"].append(next((1 / (j + 1) for j, h in enumerate(hits) if h), 0.0))
    out = {f"{name}@{k}": float(np.mean(v)) for name, v in per_user.items()}
    out[f"coverage@{k}"] = len(covered) / num_items
    out["num_users_evaluated"] = len(per_user["recall"])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_random_against_loop_reference(seed):
    num_items = 30
    topk, relevant = _random_case(seed, num_items=num_items)
    assert (relevant.lengths() == 0).any() and (topk == -1).any()  # the case covers both edge cases
    ks = [1, 3, 5, 12]
    got = compute_metrics(topk, relevant, ks, num_items=num_items)
    for k in ks:
        for key, value in _loop_reference(topk, relevant, k, num_items).items():
            assert got[key] == pytest.approx(value, rel=1e-12), key


@pytest.mark.parametrize("seed", range(3))
def test_random_hit_matrix_against_loop(seed):
    topk, relevant = _random_case(seed)
    expected = np.array(
        [[i >= 0 and i in set(relevant.row(u).tolist()) for i in topk[u]] for u in range(topk.shape[0])]
    )
    np.testing.assert_array_equal(hit_matrix(topk, relevant), expected)


# ---------------------------------------------------------------------------------------------
# UserItemCSR
# ---------------------------------------------------------------------------------------------


def _as_sets(csr: UserItemCSR) -> list[set[int]]:
    return [set(csr.row(u).tolist()) for u in range(csr.num_users)]


def test_csr_from_pairs_layout():
    csr = UserItemCSR.from_pairs([2, 0, 2, 0, 2, 2], [4, 5, 0, 2, 1, 0], num_users=3, num_items=6)
    np.testing.assert_array_equal(csr.indptr, [0, 2, 2, 5])
    np.testing.assert_array_equal(csr.indices, [2, 5, 0, 1, 4])  # sorted, duplicate (2, 0) dropped
    np.testing.assert_array_equal(csr.lengths(), [2, 0, 3])
    np.testing.assert_array_equal(csr.row(2), [0, 1, 4])
    assert csr.indptr.dtype == np.int64 and csr.indices.dtype == np.int64


def test_csr_rejects_out_of_range():
    with pytest.raises(ValueError):
        UserItemCSR.from_pairs([0], [6], num_users=1, num_items=6)
    with pytest.raises(ValueError):
        UserItemCSR.from_pairs([1], [0], num_users=1, num_items=6)


@pytest.mark.parametrize("seed", range(3))
def test_csr_union_and_select_rows(seed):
    rng = np.random.default_rng(seed)
    a_pairs, b_pairs = rng.integers(0, [20, 15], size=(2, 60, 2))
    a = UserItemCSR.from_pairs(a_pairs[:, 0], a_pairs[:, 1], num_users=20, num_items=15)
    b = UserItemCSR.from_pairs(b_pairs[:, 0], b_pairs[:, 1], num_users=20, num_items=15)
    union = a.union(b)
    assert _as_sets(union) == [x | y for x, y in zip(_as_sets(a), _as_sets(b))]
    for u in range(20):
        row = union.row(u)
        assert (np.diff(row) > 0).all()

    users = rng.integers(0, 20, size=30)  # any order, with repeats
    sel = union.select_rows(users)
    assert sel.num_users == 30 and sel.num_items == 15
    for j, u in enumerate(users):
        np.testing.assert_array_equal(sel.row(j), union.row(u))


@pytest.mark.parametrize("size", [0, 1, 2, 1000])
def test_sorted_unique_is_np_unique(size):
    values = np.random.default_rng(size).integers(0, max(size // 3, 1), size)  # many repeats
    np.testing.assert_array_equal(sorted_unique(values), np.unique(values))
    assert sorted_unique(values).dtype == values.dtype
