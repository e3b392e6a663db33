"""Split protocols on hand-built interactions whose split sizes can be computed by hand."""

import numpy as np
import pandas as pd
import pytest

from data_pipelines.splits import PROTOCOLS, recbole_split_sizes, split, split_loo, split_recbole

# user_id -> number of interactions, and the recbole (train, valid, test) sizes by the rule
# n < 3: all train; n_test = clip(round_half_up(0.1 n), 1, n-2); n_valid = clip(round_half_up(0.1 n), 1, n-1-n_test)
HAND = {
    0: (1, (1, 0, 0)),
    1: (3, (1, 1, 1)),
    2: (10, (8, 1, 1)),
    3: (20, (16, 2, 2)),
    4: (15, (11, 2, 2)),
    5: (4, (2, 1, 1)),
    6: (2, (2, 0, 0)),
    7: (5, (3, 1, 1)),
}


def _hand_df() -> pd.DataFrame:
    rows = []
    for user, (n, _) in HAND.items():
        for j in range(n):
            timestamp = 1000 + 100 * user + (1 if j == 2 else j)  # increasing, with one tie (j = 1, 2)
            rows.append((user, (user * 7 + j * 3) % 50, timestamp, float(j % 5 + 1)))
    df = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp", "rating"])
    df = df.astype({"user_id": "int64", "item_id": "int64", "timestamp": "int64", "rating": "float32"})
    return df.sample(frac=1.0, random_state=0).reset_index(drop=True)  # input order must not matter


def _rows(df: pd.DataFrame) -> list[tuple]:
    return sorted(map(tuple, df.to_numpy().tolist()))


def _assert_canonical(df: pd.DataFrame, like: pd.DataFrame) -> None:
    assert list(df.columns) == list(like.columns)
    assert (df.dtypes == like.dtypes).all()
    assert isinstance(df.index, pd.RangeIndex) and df.index.start == 0
    expect = df.sort_values(["user_id", "timestamp", "item_id"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(df, expect)


def test_recbole_exact_sizes_per_user():
    df = _hand_df()
    parts = split_recbole(df, seed=0)
    for user, (n, expected) in HAND.items():
        assert tuple(int((p.user_id == user).sum()) for p in parts) == expected, f"user {user} with {n} rows"
    assert [len(p) for p in parts] == [sum(e[i] for _, e in HAND.values()) for i in range(3)] == [44, 8, 8]


def test_recbole_split_sizes_rule():
    n = np.array([0, 1, 2, 3, 4, 5, 9, 14, 15, 24, 25, 100])
    expected = [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 0),
        (1, 1, 1),
        (2, 1, 1),
        (3, 1, 1),
        (7, 1, 1),
        (12, 1, 1),
        (11, 2, 2),
        (20, 2, 2),
        (19, 3, 3),
        (80, 10, 10),
    ]
    assert [tuple(r) for r in recbole_split_sizes(n).tolist()] == expected
    # lopsided ratios still leave every splittable user one train row
    assert recbole_split_sizes(np.array([3, 10]), (0.1, 0.45, 0.45)).tolist() == [[1, 1, 1], [1, 4, 5]]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_union_is_input_and_outputs_canonical(protocol):
    df = _hand_df()
    parts = split(df, protocol, seed=3)
    assert _rows(pd.concat(parts)) == _rows(df)  # nothing lost, nothing duplicated
    for p in parts:
        _assert_canonical(p, df)


def test_recbole_seeded_and_order_independent():
    df = _hand_df()
    a = split_recbole(df, seed=0)
    b = split_recbole(df.sample(frac=1.0, random_state=1), seed=0)
    c = split_recbole(df, seed=1)
    for x, y in zip(a, b):
        pd.testing.assert_frame_equal(x, y)
    assert not a[2].equals(c[2]), "a different seed must pick different test rows"
    assert [len(p) for p in a] == [len(p) for p in c]


def test_loo_latest_is_test_second_latest_is_valid():
    df = _hand_df()
    train, valid, test = split_loo(df)
    for user, (n, _) in HAND.items():
        mine = df[df.user_id == user].sort_values(["timestamp", "item_id"])
        got = [int((p.user_id == user).sum()) for p in (train, valid, test)]
        if n < 3:
            assert got == [n, 0, 0]
            continue
        assert got == [n - 2, 1, 1]
        assert test[test.user_id == user].item_id.item() == mine.item_id.iloc[-1]
        assert valid[valid.user_id == user].item_id.item() == mine.item_id.iloc[-2]
        assert train[train.user_id == user].timestamp.max() <= valid[valid.user_id == user].timestamp.item()


def test_loo_breaks_timestamp_ties_by_item_id():
    df = pd.DataFrame(
        {"user_id": [0, 0, 0, 0], "item_id": [9, 4, 7, 1], "timestamp": [5, 5, 5, 1], "rating": [1.0] * 4}
    )
    train, valid, test = split_loo(df)
    assert test.item_id.tolist() == [9] and valid.item_id.tolist() == [7] and sorted(train.item_id) == [1, 4]


def test_unknown_protocol_lists_known_ones():
    with pytest.raises(ValueError, match=r"'nope'.*loo.*recbole"):
        split(_hand_df(), "nope", seed=0)


def test_missing_column_is_named():
    with pytest.raises(ValueError, match="timestamp"):
        split_loo(_hand_df().drop(columns=["timestamp"]))


def test_recbole_on_one_million_rows_keeps_every_row():
    """At MovieLens-1M scale (its speed is measured by scripts/bench_data.py, which times the whole prepare:
    a wall-clock bound here failed on a loaded machine)."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    df = pd.DataFrame(
        {
            "user_id": rng.integers(0, 6040, n),
            "item_id": rng.integers(0, 3706, n),
            "timestamp": rng.integers(0, 10**9, n),
            "rating": rng.integers(1, 6, n).astype(np.float32),
        }
    )
    parts = split_recbole(df, seed=0)
    assert sum(len(p) for p in parts) == n
