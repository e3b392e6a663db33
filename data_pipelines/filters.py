"""The filters that run before a split protocol: minimum rating, one row per (user, item) (the latest),
then an iterated k-core on users and items (``filter_interactions``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from data_pipelines.rows import compose, lexsort_order, take_rows

__all__ = ["filter_interactions"]


def _counts_of(ids: np.ndarray) -> np.ndarray:
    """For each row, how many rows share its id (bincount when ids are small non-negative ints)."""
    if len(ids) and ids.min() >= 0 and ids.max() < 4 * len(ids) + 1024:
        return np.bincount(ids)[ids]
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    return counts[inverse]


def filter_interactions(
    df: pd.DataFrame, *, min_rating: float = 0.0, min_user_interactions: int = 0, min_item_interactions: int = 0
) -> pd.DataFrame:
    """Rows with ``rating >= min_rating``, one per (user, item) (the latest), then the k-core.

    The k-core repeats "drop users with < min_user_interactions rows, then items with
    < min_item_interactions rows" until nothing changes (0 disables either side). Returns a
    new frame with a fresh index, rows in their input order. Works on row numbers: the
    frame's columns are copied once, at the end.
    """
    rows = None  # rows of df kept so far, ascending (None = all)
    users, items = df["user_id"].to_numpy(), df["item_id"].to_numpy()
    if min_rating > 0:
        keep = df["rating"].to_numpy() >= min_rating
        if not keep.all():
            rows = np.flatnonzero(keep)
            users, items = np.compress(keep, users), np.compress(keep, items)
    if len(users):
        pairs = lexsort_order((items, users))  # cheap: (user, item) packs into few bits; None when sorted
        u, i = (users, items) if pairs is None else (users[pairs], items[pairs])
        same_pair = (u[1:] == u[:-1]) & (i[1:] == i[:-1])
        if same_pair.any():  # duplicates: keep each pair's latest row (the last in the file among ties)
            # rows sorted by pair, stably (file order within a pair): per run, the last row at the run's
            # largest timestamp. Two passes over the runs instead of a three-key sort.
            n = len(users)
            order = np.arange(n) if pairs is None else pairs
            timestamps = df["timestamp"].to_numpy()
            ts = (timestamps if rows is None else timestamps[rows])[order]
            starts = np.flatnonzero(np.r_[True, ~same_pair])
            latest = np.repeat(np.maximum.reduceat(ts, starts), np.diff(np.r_[starts, n]))
            last = np.maximum.reduceat(np.where(ts == latest, np.arange(n), -1), starts)
            keep = np.zeros(n, dtype=bool)
            keep[order[last]] = True
            rows = compose(rows, keep)
            users, items = np.compress(keep, users), np.compress(keep, items)
    while min_user_interactions > 0 or min_item_interactions > 0:
        keep = np.ones(len(users), dtype=bool)
        for ids, k in ((users, min_user_interactions), (items, min_item_interactions)):
            if k > 0:
                keep &= _counts_of(ids) >= k
        if keep.all():
            break
        rows = compose(rows, keep)
        users, items = np.compress(keep, users), np.compress(keep, items)
    return take_rows(df, rows)
