"""splits.py additions for MovieLens: lexsort_fast == np.lexsort, the filters, strong generalization."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from data_pipelines.filters import filter_interactions
from data_pipelines.rows import lexsort_fast, lexsort_order
from data_pipelines.splits import (
    _random_as_ints,
    split,
    split_strong_generalization,
    strong_generalization_users,
)


@pytest.mark.parametrize(
    "n, user_hi, ts_hi, item_hi", [(10_000, 50, 10**9, 5000), (5_000, 3, 5, 4), (2000, 2**20, 2**40, 2**20)]
)
def test_lexsort_fast_is_lexsort(n, user_hi, ts_hi, item_hi):
    rng = np.random.default_rng(n)
    keys = (rng.integers(0, item_hi, n), rng.integers(-5, ts_hi, n), rng.integers(0, user_hi, n))
    assert np.array_equal(lexsort_fast(keys), np.lexsort(keys))  # ties included (small ranges), > 64 bits
    draws = (rng.random(n) * 2.0**53).astype(np.uint64)
    draws[:10] = draws[10:20]  # exact ties too
    assert np.array_equal(lexsort_fast((draws, keys[2]), truncate_last=True), np.lexsort((draws, keys[2])))


def _df(rows):
    return pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp", "rating"]).astype(
        {"user_id": "int64", "item_id": "int64", "timestamp": "int64", "rating": "float32"}
    )


def test_filters_rating_dedupe_and_iterated_k_core():
    rows = [(1, i, i, 5.0) for i in range(5)] + [(2, i, i, 5.0) for i in range(2)] + [(3, 0, 1, 1.0)]
    rows += [(1, 0, 100, 4.0)]  # duplicate (1, 0): the latest (timestamp 100) stays
    out = filter_interactions(_df(rows), min_rating=3.0)
    assert len(out) == 7 and out[(out.user_id == 1) & (out.item_id == 0)].timestamp.tolist() == [100]
    # k-core 2/2: user 2 (2 rows) keeps items 0, 1; items 2..4 (one row each) go, then user 1 has 2 rows left
    core = filter_interactions(_df(rows), min_rating=3.0, min_user_interactions=2, min_item_interactions=2)
    assert sorted(map(tuple, core[["user_id", "item_id"]].to_numpy().tolist())) == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_strong_generalization_by_hand():
    # 10 users x the same 10 items: 2 validation + 2 test users give floor(0.2 * 10) = 2 targets each
    df = _df([(u, i, 100 * u + i, 5.0) for u in range(10) for i in range(10)])
    train, valid, test = split_strong_generalization(df, seed=0, num_heldout_users=2)
    assert (len(train), len(valid), len(test)) == (92, 4, 4)
    valid_users, test_users = strong_generalization_users(df, seed=0, num_heldout_users=2)
    assert set(valid.user_id) == set(valid_users) and set(test.user_id) == set(test_users)
    assert not set(valid_users) & set(test_users)
    for u in [*valid_users, *test_users]:  # fold-in (8) in train, targets (2) elsewhere, disjoint
        assert (train.user_id == u).sum() == 8
    again = split(df, "strong_generalization", seed=0, num_heldout_users=2)
    for a, b in zip((train, valid, test), again):
        pd.testing.assert_frame_equal(a, b)
    assert not split_strong_generalization(df, seed=1, num_heldout_users=2)[1].equals(valid)


def test_strong_generalization_small_users_and_unseen_items():
    # user 9 is the only one with items 50..53; fewer than 5 rows after dropping them -> all fold-in
    rows = (
        [(u, i, i, 5.0) for u in range(9) for i in range(6)]
        + [(9, 50 + i, i, 5.0) for i in range(4)]
        + [(9, 0, 9, 5.0)]
    )
    df = _df(rows)
    seed = next(
        s for s in range(100) if 9 in np.concatenate(strong_generalization_users(df, seed=s, num_heldout_users=1))
    )
    parts = split_strong_generalization(df, seed=seed, num_heldout_users=1, drop_unseen_items=True)
    assert 9 not in set(pd.concat(parts[1:]).user_id)  # 1 row left (< 5): no targets
    assert parts[0].item_id[parts[0].user_id == 9].tolist() == [0]  # items 50..53 dropped, item 0 is fold-in
    assert sum(len(p) for p in parts) == len(df) - 4
    assert sum(len(p) for p in parts) <= len(df)
    with pytest.raises(ValueError, match="leave no training users"):
        split_strong_generalization(df, seed=0, num_heldout_users=5)


def test_proportional_heldout_count():
    df = _df([(u, 0, u, 5.0) for u in range(136_677 // 10)])
    valid_users, test_users = strong_generalization_users(df, seed=0)
    assert len(valid_users) == len(test_users) == 1000  # 10000 x 13667 / 136677, rounded


def test_lexsort_order_is_none_when_sorted_and_fast_paths_are_exact():
    rng = np.random.default_rng(1)
    users = np.sort(rng.integers(0, 2_000, 200_000))
    items = rng.integers(0, 50_000, 200_000)
    pairs = np.lexsort((items, users))
    assert lexsort_order((items[pairs], users)) is None  # sorted: no permutation to apply
    assert np.array_equal(lexsort_order((items, users)), pairs)
    # grouped primary key: with 2**40 timestamps an index does not fit, the position within a user does
    timestamps = rng.integers(0, 2**40, 200_000)
    timestamps[:100] = timestamps[100:200]
    assert np.array_equal(lexsort_fast((timestamps, users)), np.lexsort((timestamps, users)))
    # truncated draws: rows equal but for the dropped bits are re-sorted by the full draw
    draws = rng.integers(0, 2**53, 200_000, dtype=np.uint64)
    draws[1::2] = draws[::2] ^ np.uint64(1)  # pairs differing only in the lowest bit
    for primary in (users, rng.permutation(users)):
        assert np.array_equal(lexsort_fast((draws, primary), truncate_last=True), np.lexsort((draws, primary)))


def test_random_as_ints_is_random_times_2_53():
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert np.array_equal(_random_as_ints(a, 1000), (b.random(1000) * 2.0**53).astype(np.uint64))
    assert a.random() == b.random()  # same generator state afterwards


def test_filter_keeps_input_order_and_columns():
    rows = [(2, 5, 9, 4.0), (1, 7, 3, 2.0), (1, 5, 1, 5.0), (2, 5, 4, 3.5), (3, 1, 2, 3.0)]
    df = _df(rows).assign(extra=np.arange(5))
    out = filter_interactions(df, min_rating=3.0)
    assert out.columns.tolist() == df.columns.tolist() and (out.dtypes == df.dtypes).all()
    assert out.extra.tolist() == [0, 2, 4]  # (2, 5) twice: the later timestamp (9) stays
    assert isinstance(out.index, pd.RangeIndex)
