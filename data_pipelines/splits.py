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
- ``strong_generalization`` (Liang et al. 2018, "Variational Autoencoders for Collaborative
  Filtering"): users, not rows, are held out. A seeded permutation of the users gives
  ``num_heldout_users`` validation users, as many test users (disjoint), the rest training
  users. With ``drop_unseen_items`` (Liang's code does this; the MovieLens pipeline sets it)
  held-out users' rows whose item no training user has are dropped, the one case where rows
  are lost. Each held-out user with >= 5 remaining rows gives
  ``floor(0.2 n)`` random rows to their split (the targets); the other 80 % (the fold-in
  history, all of it for users with < 5 rows) go to ``train``::

      train = every row of the training users  +  the held-out users' fold-in rows
      valid = the validation users' targets;   test = the test users' targets

  ``num_heldout_users=0`` means ``round(10000 * num_users / 136677)`` (at least 1): Liang's
  10k of ML-20M's 136,677 filtered users, scaled. ``strong_generalization_users`` names the
  held-out users (a trainer that must not fit them removes their ``train`` rows).

Filters (``filter_interactions``) run before a protocol: minimum rating, duplicate
(user, item) pairs (the latest kept), then an iterated k-core on users and items.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

__all__ = [
    "PROTOCOLS",
    "filter_interactions",
    "lexsort_fast",
    "split",
    "split_loo",
    "split_recbole",
    "split_strong_generalization",
    "strong_generalization_users",
]

COLUMNS = ("user_id", "item_id", "timestamp", "rating")
MIN_INTERACTIONS_TO_SPLIT = 3  # fewer than this and a user cannot give one row to each split
LIANG_HELDOUT_USERS, LIANG_NUM_USERS = 10_000, 136_677  # ML-20M after Liang's filter: 10k valid + 10k test users
LIANG_MIN_TARGET_USERS_ROWS = 5  # held-out users with fewer rows are all fold-in (no targets)
LIANG_TARGET_FRACTION = 0.2  # share of a held-out user's rows that are targets (floored)

Splits = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def lexsort_fast(keys: tuple[np.ndarray, ...], *, truncate_last: bool = False) -> np.ndarray:
    """Exactly ``np.lexsort(keys)`` (the LAST key is primary, stable), often 10-40x faster.

    Integer keys are shifted to start at 0 and packed into one uint64 (primary key in the
    high bits), which numpy's vectorised sort orders in one pass; an equal packed pair
    means equal keys, resolved by a stable sort as lexsort would. When the keys need more
    than 64 bits it falls back to ``np.lexsort``, except that with ``truncate_last`` the
    least significant key (``keys[0]``, e.g. uniform random draws as integers) may lose
    low bits: then any equal packed pair falls back to ``np.lexsort``, so the result is
    still exact.
    """
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    shifted, bits = [], []
    for k in reversed(keys):  # primary first
        k = np.asarray(k)
        if not np.issubdtype(k.dtype, np.integer):
            return np.lexsort(keys)
        lo = int(k.min())
        span = int(k.max()) - lo
        shifted.append((k - lo).astype(np.uint64) if lo else k.astype(np.uint64))
        bits.append(max(span.bit_length(), 1))
    total = sum(bits)
    truncated = 0
    if total > 64:
        truncated = total - 64
        if not truncate_last or truncated >= bits[-1]:
            return np.lexsort(keys)
        shifted[-1] = shifted[-1] >> np.uint64(truncated)
        bits[-1] -= truncated
    packed = np.zeros(n, dtype=np.uint64)
    for k, b in zip(shifted, bits):
        packed <<= np.uint64(b)
        packed |= k
    if (packed[1:] > packed[:-1]).all():  # already strictly sorted (MovieLens files often are)
        return np.arange(n, dtype=np.int64)
    order = np.argsort(packed)
    sorted_packed = packed[order]
    if (sorted_packed[1:] == sorted_packed[:-1]).any():
        return np.lexsort(keys) if truncated else np.argsort(packed, kind="stable")
    return order


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` sorted by (user_id, timestamp, item_id) (stable), index reset."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"interactions lack column(s) {missing}; have {list(df.columns)}")
    order = lexsort_fast((df["item_id"].to_numpy(), df["timestamp"].to_numpy(), df["user_id"].to_numpy()))
    if np.array_equal(order, np.arange(len(df))):
        return df.reset_index(drop=True)
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
    # user runs stay in place, rows shuffled within; random() draws are k / 2^53, k exact in uint64
    shuffled = lexsort_fast(((keys * 2.0**53).astype(np.uint64), user_ids), truncate_last=True)
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


def _num_heldout(num_users: int, num_heldout_users: int) -> int:
    if num_heldout_users < 0:
        raise ValueError(f"num_heldout_users must be >= 0 (0 = proportional), got {num_heldout_users}")
    if num_heldout_users == 0:
        num_heldout_users = max(1, int(np.floor(LIANG_HELDOUT_USERS * num_users / LIANG_NUM_USERS + 0.5)))
    if 2 * num_heldout_users >= num_users:
        raise ValueError(
            f"strong_generalization: {num_heldout_users} validation + {num_heldout_users} test users leave no "
            f"training users out of {num_users}"
        )
    return num_heldout_users


def strong_generalization_users(df: pd.DataFrame, *, seed: int, num_heldout_users: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(validation user ids, test user ids), each sorted: the held-out users of ``split_strong_generalization``.

    One ``default_rng(seed).permutation`` of the sorted distinct user ids: its last
    ``2 h`` entries are held out, the first ``h`` of those validation, the last ``h`` test.
    """
    users = np.unique(df["user_id"].to_numpy())
    h = _num_heldout(len(users), num_heldout_users)
    perm = np.random.default_rng(seed).permutation(users)
    return np.sort(perm[len(users) - 2 * h : len(users) - h]), np.sort(perm[len(users) - h :])


def split_strong_generalization(
    df: pd.DataFrame, *, seed: int, num_heldout_users: int = 0, drop_unseen_items: bool = False
) -> Splits:
    """Liang et al. 2018's user split; see the module docstring for the layout.

    Randomness: the permutation of ``strong_generalization_users``, then one ``random()``
    draw per held-out row (canonical order, same generator): per user the rows with the
    ``floor(0.2 n)`` smallest draws are the targets.
    """
    df = _canonical(df)
    rng = np.random.default_rng(seed)
    users = np.unique(df["user_id"].to_numpy())
    h = _num_heldout(len(users), num_heldout_users)
    perm = rng.permutation(users)
    valid_users, test_users = np.sort(perm[len(users) - 2 * h : len(users) - h]), np.sort(perm[len(users) - h :])
    user_ids = df["user_id"].to_numpy()
    in_valid, in_test = np.isin(user_ids, valid_users), np.isin(user_ids, test_users)
    heldout = in_valid | in_test
    if drop_unseen_items:
        train_items = np.unique(df["item_id"].to_numpy()[~heldout])
        keep = ~heldout | np.isin(df["item_id"].to_numpy(), train_items)
        df, in_valid, in_test, heldout = _take(df, keep), in_valid[keep], in_test[keep], heldout[keep]

    rows = np.flatnonzero(heldout)  # canonical order, so each user's rows are one run
    keys = rng.random(len(rows))
    sub_users = df["user_id"].to_numpy()[rows]
    shuffled = lexsort_fast(((keys * 2.0**53).astype(np.uint64), sub_users), truncate_last=True)
    rank_in_shuffled, n_of_row = _group_positions(sub_users[shuffled])
    rank = np.empty(len(rows), dtype=np.int64)
    rank[shuffled] = rank_in_shuffled
    n_target = np.where(n_of_row >= LIANG_MIN_TARGET_USERS_ROWS, np.floor(n_of_row * LIANG_TARGET_FRACTION), 0)
    target = np.zeros(len(df), dtype=bool)
    target[rows] = rank < n_target
    return _take(df, ~target), _take(df, target & in_valid), _take(df, target & in_test)


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
    new frame with a fresh index, rows in their input order.
    """
    if min_rating > 0:
        keep = df["rating"].to_numpy() >= min_rating
        if not keep.all():
            df = df[keep]
    users, items = df["user_id"].to_numpy(), df["item_id"].to_numpy()
    if len(df):
        pairs = lexsort_fast((items, users))  # cheap: (user, item) packs into few bits; O(n) when sorted
        if pairs[-1] == len(pairs) - 1 and np.array_equal(pairs, np.arange(len(pairs))):
            u, i = users, items
        else:
            u, i = users[pairs], items[pairs]
        if ((u[1:] == u[:-1]) & (i[1:] == i[:-1])).any():  # duplicates: keep each pair's latest row
            order = np.lexsort((df["timestamp"].to_numpy(), items, users))
            u, i = users[order], items[order]
            last_of_pair = np.r_[(u[1:] != u[:-1]) | (i[1:] != i[:-1]), True]
            keep = np.zeros(len(df), dtype=bool)
            keep[order[last_of_pair]] = True
            df = df[keep]
    while min_user_interactions > 0 or min_item_interactions > 0:
        keep = np.ones(len(df), dtype=bool)
        for column, k in (("user_id", min_user_interactions), ("item_id", min_item_interactions)):
            if k > 0:
                keep &= _counts_of(df[column].to_numpy()) >= k
        if keep.all():
            break
        df = df[keep]
    return df.reset_index(drop=True)


PROTOCOLS: dict[str, Callable[..., Splits]] = {
    "recbole": lambda df, *, seed, **options: split_recbole(df, seed=seed, **options),
    "loo": lambda df, *, seed, **options: split_loo(df, **options),  # deterministic; the seed is unused
    "strong_generalization": lambda df, *, seed, **options: split_strong_generalization(df, seed=seed, **options),
}


def split(df: pd.DataFrame, protocol: str, *, seed: int, **options) -> Splits:
    """Split ``df`` by the named protocol (a key of ``PROTOCOLS``); ``options`` go to its function."""
    try:
        fn = PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(f"unknown split protocol {protocol!r}; known: {sorted(PROTOCOLS)}") from None
    return fn(df, seed=seed, **options)
