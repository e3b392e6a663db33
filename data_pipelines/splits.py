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

Filters (``filters.filter_interactions``) run before a protocol.

Speed: the protocols work on row numbers (``rows``) and copy a frame's columns once, at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from data_pipelines.rows import compose, lexsort_fast, lexsort_order, run_starts, take_rows

__all__ = [
    "PROTOCOLS",
    "draw_heldout_users",
    "split",
    "split_loo",
    "split_recbole",
    "split_heldout_users",
    "split_strong_generalization",
    "strong_generalization_users",
    "carve_valid",
]

COLUMNS = ("user_id", "item_id", "timestamp", "rating")
MIN_INTERACTIONS_TO_SPLIT = 3  # fewer than this and a user cannot give one row to each split
LIANG_HELDOUT_USERS, LIANG_NUM_USERS = 10_000, 136_677  # ML-20M after Liang's filter: 10k valid + 10k test users
LIANG_MIN_TARGET_USERS_ROWS = 5  # held-out users with fewer rows are all fold-in (no targets)
_PARALLEL_TAKE_ROWS = 1 << 20  # from this many rows the output columns are copied on two threads
LIANG_TARGET_FRACTION = 0.2  # share of a held-out user's rows that are targets (floored)

Splits = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"interactions lack column(s) {missing}; have {list(df.columns)}")


def _canonical_order(df: pd.DataFrame) -> np.ndarray | None:
    """Row order sorting ``df`` by (user_id, timestamp, item_id), stable; None when already sorted.

    Two one-pass sorts instead of one lexsort of three keys: rows sorted by (user_id, item_id)
    (MovieLens files come so) need only a stable sort by (user_id, timestamp), whose user
    runs let the row's position within its user be the tie-breaker.
    """
    _check_columns(df)
    users, items, timestamps = (df[c].to_numpy() for c in ("user_id", "item_id", "timestamp"))
    by_pair = lexsort_order((items, users))
    if by_pair is not None:
        users, timestamps = users[by_pair], timestamps[by_pair]
    order = lexsort_order((timestamps, users))
    if by_pair is None:
        return order
    return by_pair if order is None else by_pair[order]


def _group_positions(user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ids sorted into runs: (position of each row within its run, size of its run)."""
    n = len(user_ids)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts, sizes = run_starts(user_ids)
    return np.arange(n) - np.repeat(starts, sizes), np.repeat(sizes, sizes)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def _random_as_ints(rng: np.random.Generator, n: int) -> np.ndarray:
    """``(rng.random(n) * 2**53).astype(np.uint64)`` without the floats: ``random()`` is the top 53 bits
    of one raw 64-bit draw times 2^-53, so these are the same numbers, same order, same generator state."""
    return rng.bit_generator.random_raw(n) >> np.uint64(11)


def _split_by_label(df: pd.DataFrame, order: np.ndarray | None, label: np.ndarray) -> Splits:
    """Rows of ``df`` in canonical ``order`` (None = as they are) labelled 0 train, 1 valid, 2 test."""
    rows = [compose(order, label == s) for s in range(3)]
    numeric = all(isinstance(t, np.dtype) for t in df.dtypes) and not df.columns.has_duplicates
    if len(df) < _PARALLEL_TAKE_ROWS or not numeric or any(r is None for r in rows):
        return tuple(take_rows(df, r) for r in rows)  # type: ignore[return-value]
    # the copies are most of the split's time; np.take releases the GIL, so two threads share them
    columns = [df[c].to_numpy() for c in df.columns]
    with ThreadPoolExecutor(max_workers=2) as pool:
        taken = list(pool.map(lambda job: np.take(columns[job[1]], rows[job[0]]), np.ndindex(3, len(columns))))
    return tuple(  # type: ignore[return-value]
        pd.DataFrame(
            dict(zip(df.columns, taken[s * len(columns) : (s + 1) * len(columns)])), columns=df.columns, copy=False
        )
        for s in range(3)
    )


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


def split_recbole(
    df: pd.DataFrame,
    *,
    seed: int,
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
    rng: np.random.Generator | None = None,
) -> Splits:
    """Random per-user split; see the module docstring for the exact counts.

    Vectorized: one sort by (user_id, random key), then each row's rank within its user
    picks its split (rank < n_test -> test, < n_test + n_valid -> valid, else train).
    ``rng`` (default ``default_rng(seed)``) lets a caller split a log in ascending ranges of
    users with one generator: the draws, and so the result, are those of one call on the whole log.
    """
    order = _canonical_order(df)
    user_ids = df["user_id"].to_numpy()
    if order is not None:
        user_ids = user_ids[order]
    n = len(user_ids)
    keys = _random_as_ints(np.random.default_rng(seed) if rng is None else rng, n)
    shuffled = lexsort_fast((keys, user_ids), truncate_last=True)  # user runs stay in place, rows shuffled within
    label = np.zeros(n, dtype=np.int8)  # 0 train, 1 valid, 2 test
    if n:
        starts, lengths = run_starts(user_ids)  # the same runs in shuffled order
        sizes = recbole_split_sizes(lengths, ratios)
        rank_in_shuffled = np.arange(n) - np.repeat(starts, lengths)
        n_test = np.repeat(sizes[:, 2], lengths)
        in_shuffled = (rank_in_shuffled < n_test).astype(np.int8)
        in_shuffled += rank_in_shuffled < n_test + np.repeat(sizes[:, 1], lengths)
        label[shuffled] = in_shuffled
    return _split_by_label(df, order, label)


def split_loo(df: pd.DataFrame) -> Splits:
    """Temporal leave-one-out: per user last by (timestamp, item_id) -> test, second last -> valid."""
    order = _canonical_order(df)
    user_ids = df["user_id"].to_numpy()
    if order is not None:
        user_ids = user_ids[order]
    label = np.zeros(len(user_ids), dtype=np.int8)
    if len(user_ids):
        starts, lengths = run_starts(user_ids)
        ends = (starts + lengths)[lengths >= MIN_INTERACTIONS_TO_SPLIT]
        label[ends - 1] = 2  # the user's latest interaction
        label[ends - 2] = 1
    return _split_by_label(df, order, label)


def carve_valid(
    df: pd.DataFrame, *, fraction: float, seed: int, latest: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, valid): per user, ``round(fraction * n)`` random rows of their ``n`` become valid (``latest``: their
    last rows in (timestamp, item_id) order instead, for a test file that holds each user's later interactions).

    For given splits without a validation file: only the training file is cut, so the test file is
    never used for any choice. ``round`` is half up and each user keeps at least one training row
    (n = 1 gives nothing to valid). Rows are chosen by one uniform draw per row from
    ``default_rng(seed)`` in canonical (user_id, timestamp, item_id) order, as in ``split_recbole``.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"valid fraction must be in (0, 1), got {fraction}")
    order = _canonical_order(df)
    user_ids = df["user_id"].to_numpy()
    if order is not None:
        user_ids = user_ids[order]
    n = len(user_ids)
    label = np.zeros(n, dtype=np.int8)
    if n:
        starts, lengths = run_starts(user_ids)
        n_valid = np.minimum(_round_half_up(lengths * fraction), lengths - 1)
        rank = np.arange(n) - np.repeat(starts, lengths)
        if latest:  # canonical order is by time within a user: the last n_valid of each run
            label[:] = (rank >= np.repeat(lengths - n_valid, lengths)).astype(np.int8)
        else:
            keys = _random_as_ints(np.random.default_rng(seed), n)
            shuffled = lexsort_fast((keys, user_ids), truncate_last=True)
            label[shuffled] = (rank < np.repeat(n_valid, lengths)).astype(np.int8)
    train, valid, _ = _split_by_label(df, order, label)
    return train, valid


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


def strong_generalization_users(
    df: pd.DataFrame, *, seed: int, num_heldout_users: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(validation user ids, test user ids), each sorted: the held-out users of ``split_strong_generalization``.

    One ``default_rng(seed).permutation`` of the sorted distinct user ids: its last
    ``2 h`` entries are held out, the first ``h`` of those validation, the last ``h`` test.
    """
    return draw_heldout_users(np.unique(df["user_id"].to_numpy()), np.random.default_rng(seed), num_heldout_users)


def split_strong_generalization(
    df: pd.DataFrame, *, seed: int, num_heldout_users: int = 0, drop_unseen_items: bool = False
) -> Splits:
    """Liang et al. 2018's user split; see the module docstring for the layout.

    Randomness: the permutation of ``strong_generalization_users``, then one ``random()``
    draw per held-out row (canonical order, same generator): per user the rows with the
    ``floor(0.2 n)`` smallest draws are the targets.
    """
    rng = np.random.default_rng(seed)
    valid_users, test_users = draw_heldout_users(np.unique(df["user_id"].to_numpy()), rng, num_heldout_users)
    return split_heldout_users(
        df, valid_users=valid_users, test_users=test_users, rng=rng, drop_unseen_items=drop_unseen_items
    )


def draw_heldout_users(
    users: np.ndarray, rng: np.random.Generator, num_heldout_users: int
) -> tuple[np.ndarray, np.ndarray]:
    """(validation users, test users), each sorted: the last ``2 h`` of one ``rng.permutation(users)``."""
    h = _num_heldout(len(users), num_heldout_users)
    perm = rng.permutation(users)
    return np.sort(perm[len(users) - 2 * h : len(users) - h]), np.sort(perm[len(users) - h :])


def split_heldout_users(
    df: pd.DataFrame,
    *,
    valid_users: np.ndarray,
    test_users: np.ndarray,
    rng: np.random.Generator,
    drop_unseen_items: bool = False,
    train_items: np.ndarray | None = None,
) -> Splits:
    """``split_strong_generalization`` after its permutation: the held-out users are given and
    ``rng`` draws the targets. ``train_items`` (sorted; default: the items of ``df``'s other users)
    lets a caller split ascending ranges of users with one generator, as one call on the whole log."""
    order = _canonical_order(df)
    user_ids, item_ids = df["user_id"].to_numpy(), df["item_id"].to_numpy()
    if order is not None:
        user_ids, item_ids = user_ids[order], item_ids[order]
    in_valid, in_test = np.isin(user_ids, valid_users), np.isin(user_ids, test_users)
    heldout = in_valid | in_test
    if drop_unseen_items:
        if train_items is None:
            train_items = np.unique(item_ids[~heldout])
        keep = ~heldout | np.isin(item_ids, train_items)
        if not keep.all():
            order = compose(order, keep)
            user_ids, in_valid, in_test, heldout = (
                np.compress(keep, a) for a in (user_ids, in_valid, in_test, heldout)
            )

    rows = np.flatnonzero(heldout)  # canonical order, so each user's rows are one run
    keys = _random_as_ints(rng, len(rows))
    sub_users = user_ids[rows]
    shuffled = lexsort_fast((keys, sub_users), truncate_last=True)
    rank_in_shuffled, n_of_row = _group_positions(sub_users[shuffled])
    rank = np.empty(len(rows), dtype=np.int64)
    rank[shuffled] = rank_in_shuffled
    n_target = np.where(n_of_row >= LIANG_MIN_TARGET_USERS_ROWS, np.floor(n_of_row * LIANG_TARGET_FRACTION), 0)
    label = np.zeros(len(user_ids), dtype=np.int8)
    target = np.zeros(len(user_ids), dtype=bool)
    target[rows] = rank < n_target
    label[target & in_valid] = 1
    label[target & in_test] = 2
    return _split_by_label(df, order, label)


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
