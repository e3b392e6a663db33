"""Split protocols: interactions -> (train, valid, test).

Every function here is pure: it takes a DataFrame with columns
``user_id, item_id, timestamp, rating`` (one row per interaction, any row order) and returns
three DataFrames with the same columns and dtypes, each sorted by
``(user_id, timestamp, item_id)`` with a fresh RangeIndex. Rows are neither lost nor
duplicated: ``concat(train, valid, test)`` is a permutation of the input rows.

Protocols (``PROTOCOLS``):

- ``recbole``: random per-user 8:1:1 split (RecBole's ``RS`` ordering with ``group_by=user``).
  For a user with ``n`` interactions, with ``round(x) = floor(x + 0.5)`` (half up)::

      n < 3:   all n to train
      n >= 3:  n_test  = clip(round(n * r_test),  1, n - 2)
               n_valid = clip(round(n * r_valid), 1, n - 1 - n_test)
               n_train = n - n_valid - n_test            (>= 1)

  e.g. n=3 -> 1/1/1, n=4 -> 2/1/1, n=10 -> 8/1/1, n=15 -> 11/2/2, n=20 -> 16/2/2.
  Which rows go where is decided by one uniform draw per row from
  ``numpy.random.default_rng(seed)``, drawn in ``(user_id, timestamp, item_id)`` order, so
  the result depends only on the data and the seed, not on the input row order.
- ``loo``: temporal leave-one-out. Per user, the last row by ``(timestamp, item_id)`` is
  test, the second last is valid, the rest train; users with < 3 interactions go to train.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

__all__ = ["PROTOCOLS", "split", "split_loo", "split_recbole"]

COLUMNS = ("user_id", "item_id", "timestamp", "rating")
MIN_INTERACTIONS_TO_SPLIT = 3  # fewer than this and a user cannot give one row to each split

Splits = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` sorted by (user_id, timestamp, item_id) (stable), index reset."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"interactions lack column(s) {missing}; have {list(df.columns)}")
    order = np.lexsort((df["item_id"].to_numpy(), df["timestamp"].to_numpy(), df["user_id"].to_numpy()))
    return df.iloc[order].reset_index(drop=True)


def _group_positions(user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ids sorted into runs: (position of each row within its run, size of its run)."""
    n = len(user_ids)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, user_ids[1:] != user_ids[:-1]])
    sizes = np.diff(np.r_[starts, n])
    run_of_row = np.repeat(np.arange(len(starts)), sizes)
    return np.arange(n) - starts[run_of_row], sizes[run_of_row]


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def _take(df: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    # df is canonical, so any row subset is canonical too.
    return df[mask].reset_index(drop=True)


def recbole_split_sizes(n: np.ndarray, ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> np.ndarray:
    """Per-user (n_train, n_valid, n_test) for interaction counts ``n``: shape [U] -> [U, 3].

    The rounding rule is in the module docstring; users with < 3 interactions get (n, 0, 0).
    """
    r = np.asarray(ratios, dtype=np.float64)
    if r.shape != (3,) or (r < 0).any() or r.sum() <= 0:
        raise ValueError(f"ratios must be three non-negative numbers (train, valid, test), got {ratios}")
    r = r / r.sum()
    n = np.asarray(n, dtype=np.int64)
    splittable = n >= MIN_INTERACTIONS_TO_SPLIT
    n_test = np.clip(_round_half_up(n * r[2]), 1, np.maximum(n - 2, 1))
    n_valid = np.clip(_round_half_up(n * r[1]), 1, np.maximum(n - 1 - n_test, 1))
    n_test = np.where(splittable, n_test, 0)
    n_valid = np.where(splittable, n_valid, 0)
    return np.stack([n - n_valid - n_test, n_valid, n_test], axis=1)


def split_recbole(df: pd.DataFrame, *, seed: int, ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> Splits:
    """Random per-user split; see the module docstring for the exact counts.

    Vectorized: one lexsort by (user_id, random key), then each row's rank within its user
    picks its split (rank < n_test -> test, < n_test + n_valid -> valid, else train).
    """
    df = _canonical(df)
    user_ids = df["user_id"].to_numpy()
    keys = np.random.default_rng(seed).random(len(df))
    shuffled = np.lexsort((keys, user_ids))  # user runs stay in place, rows shuffled within
    rank_in_shuffled, n_of_row = _group_positions(user_ids[shuffled])
    rank = np.empty(len(df), dtype=np.int64)
    rank[shuffled] = rank_in_shuffled
    sizes = recbole_split_sizes(n_of_row, ratios)
    n_valid, n_test = sizes[:, 1], sizes[:, 2]
    test = rank < n_test
    valid = ~test & (rank < n_test + n_valid)
    return _take(df, ~(test | valid)), _take(df, valid), _take(df, test)


def split_loo(df: pd.DataFrame) -> Splits:
    """Temporal leave-one-out: per user last by (timestamp, item_id) -> test, second last -> valid."""
    df = _canonical(df)
    position, n = _group_positions(df["user_id"].to_numpy())
    from_end = n - 1 - position  # 0 = the user's latest interaction
    splittable = n >= MIN_INTERACTIONS_TO_SPLIT
    test = splittable & (from_end == 0)
    valid = splittable & (from_end == 1)
    return _take(df, ~(test | valid)), _take(df, valid), _take(df, test)


PROTOCOLS: dict[str, Callable[..., Splits]] = {
    "recbole": lambda df, *, seed: split_recbole(df, seed=seed),
    "loo": lambda df, *, seed: split_loo(df),  # deterministic; the seed is unused
}


def split(df: pd.DataFrame, protocol: str, *, seed: int) -> Splits:
    """Split ``df`` by the named protocol (a key of ``PROTOCOLS``)."""
    try:
        fn = PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(f"unknown split protocol {protocol!r}; known: {sorted(PROTOCOLS)}") from None
    return fn(df, seed=seed)
