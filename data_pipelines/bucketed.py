"""A log -> filtered, split interactions in bounded memory: the generic source's one pipeline, for
logs of any size (held in memory when they fit the budget, partitioned by user on disk when not).

    record batches -> min rating, raw-id vocabularies with each user's row count       [pass 1]
      -> raw ids -> contiguous indices; rows -> buckets of ascending user ranges       [pass 2]
      -> per bucket: one row per (user, item), the latest                             [pass 3]
      -> k-core from global user / item counts (one more pass per round)
      -> per bucket, in user order: the protocol, ids compacted -> the split files   [last pass]

Every step but the vocabularies and the k-core's counts looks at one user at a time, so a bucket of
whole users is all it needs. The protocols draw from one generator in canonical
(user_id, timestamp, item_id) order, and buckets come in ascending user order, so the draws and the
dataset are exactly those of the in-memory functions of ``splits`` on the whole log (checked by
tests/data_pipelines/test_out_of_core.py). Memory: O(distinct users + items) for the vocabularies and counts, plus
one bucket (``memory_budget_bytes / _BUCKET_BYTES_PER_ROW`` rows) at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from data_pipelines.buckets import Buckets, dedupe, frames, in_order, k_core, partition, read_log
from data_pipelines.dataset_writer import InteractionsFileWriter
from data_pipelines.errors import DatasetError
from data_pipelines.spill import BatchStore
from data_pipelines.splits import (
    draw_heldout_users,
    split_heldout_users,
    split_loo,
    split_recbole,
)
from data_pipelines.vocab import IdMapper

__all__ = ["BucketedSplit", "split_log"]

# Peak bytes per row while a bucket is deduplicated and split (its columns, sort keys, the split's
# copies and the writers' row groups); measured on the 25M-row bench, rounded up.
_BUCKET_BYTES_PER_ROW = 160
_LOG_STORE_SHARE = 4  # the parsed log stays in memory up to budget / 4 bytes, then goes to disk
_PARALLEL_MIN_ROWS = 1 << 20  # from this many rows, buckets are processed on every core
_SPLITS = ("train", "valid", "test")


@dataclass
class BucketedSplit:
    """What ``split_log`` wrote and what the dataset dir's other files need."""

    files: dict[str, Path]  # train / valid / test parquet, written in the work folder
    counts: dict[str, int]
    users: pa.Array  # raw ids kept, ascending: index = user_id
    items: pa.Array
    num_raw_interactions: int
    num_buckets: int
    heldout: tuple[np.ndarray, np.ndarray] | None = None  # strong_generalization: valid / test user_ids
    options: dict[str, Any] = field(default_factory=dict)


def _generator_at(state: dict, draws: int) -> np.random.Generator:
    """A generator in ``state`` moved on by ``draws`` raw draws: a bucket's own copy of the one stream."""
    bit_generator = np.random.PCG64()
    bit_generator.state = state
    bit_generator.advance(draws)
    return np.random.Generator(bit_generator)


def split_log(
    batches: Iterable[pa.RecordBatch],
    *,
    work: Path,
    label: str,
    protocol: str,
    seed: int,
    filters: dict[str, Any],
    num_heldout_users: int,
    memory_budget_bytes: int,
    num_threads: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> BucketedSplit | None:
    """Filter and split the log in ``batches`` (columns user, item, timestamp, rating) by ``protocol``
    (recbole | loo | strong_generalization), writing the split files into ``work`` (spill files too).

    Buckets are deduplicated and split on ``num_threads`` threads (default: every core); each one
    draws from its own copy of the protocol's generator, moved on by the draws of the buckets
    before it, so the result is independent of the threads, the buckets and the budget. None when
    ``stop()`` is true once the batches end (the caller learnt the split is not needed).
    """
    log = BatchStore(work / "log.arrow", memory_budget_bytes // _LOG_STORE_SHARE)
    (raw_users, rows_per_user), raw_items, num_raw = read_log(batches, log, filters["min_rating"])
    if stop is not None and stop():
        return None
    if log.num_rows == 0:
        raise DatasetError(f"{label}: no interactions left after the filters {filters} (of {num_raw})")
    threads = num_threads or os.cpu_count() or 1
    buckets, user_bucket = _bucketed(log, work, rows_per_user, raw_users, raw_items, memory_budget_bytes, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        user_counts, item_counts = dedupe(pool, threads, buckets, len(raw_users), len(raw_items))
        min_user, min_item = filters["min_user_interactions"], filters["min_item_interactions"]
        keep_user, keep_item, user_counts = k_core(pool, threads, buckets, user_counts, item_counts, min_user, min_item)
        if not keep_user.any():
            raise DatasetError(f"{label}: no interactions left after the filters {filters} (of {num_raw})")
        plan = _plan(
            pool, threads, buckets, protocol, seed, num_heldout_users, keep_user, keep_item, user_counts, user_bucket
        )
        files = {s: work / f"{s}.parquet" for s in _SPLITS}
        counts = _write_splits(pool, threads, buckets, files, plan, protocol, filtered=min_user > 0 or min_item > 0)
    heldout = plan.heldout
    if heldout is not None:
        heldout = tuple(plan.new_user[h][plan.used_user[h]] for h in heldout)
    return BucketedSplit(
        files=files,
        counts=counts,
        users=raw_users.take(pa.array(np.flatnonzero(plan.used_user))),
        items=raw_items.take(pa.array(np.flatnonzero(plan.used_item))),
        num_raw_interactions=num_raw,
        num_buckets=buckets.num_buckets,
        heldout=heldout,
        options=plan.options,
    )


def _bucketed(
    log: BatchStore, work: Path, rows_per_user, raw_users: pa.Array, raw_items: pa.Array, budget: int, threads: int
) -> tuple[Buckets, np.ndarray]:
    """Pass 2 into buckets of contiguous user ranges of ~equal rows, ``threads`` of them within ``budget``;
    the buckets and each user's bucket."""
    bucket_rows = max(budget // (_BUCKET_BYTES_PER_ROW * threads), 1)  # `threads` buckets at once
    num_buckets = -(-log.num_rows // bucket_rows)
    if log.num_rows >= _PARALLEL_MIN_ROWS:
        num_buckets = max(num_buckets, 2 * threads)  # work for every thread
    rows_before = np.cumsum(rows_per_user) - rows_per_user
    user_bucket = rows_before * num_buckets // log.num_rows
    buckets = Buckets(work, num_buckets, in_memory=not log.on_disk)
    partition(log, buckets, IdMapper(raw_users), IdMapper(raw_items), user_bucket)
    return buckets, user_bucket


@dataclass
class _Plan:
    """Who is kept and how each bucket draws: what every bucket's split needs."""

    keep_user: np.ndarray  # k-core masks over the indices
    keep_item: np.ndarray
    used_user: np.ndarray  # masks of the ids the splits keep
    used_item: np.ndarray
    new_user: np.ndarray  # index -> compacted id
    new_item: np.ndarray
    state: dict  # the protocol generator's state before any bucket
    draws_before: np.ndarray  # per bucket: draws of the buckets before it
    heldout: tuple[np.ndarray, np.ndarray] | None = None
    train_items: np.ndarray | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _plan(
    pool,
    ahead: int,
    buckets: Buckets,
    protocol: str,
    seed: int,
    num_heldout_users: int,
    keep_user,
    keep_item,
    user_counts,
    user_bucket,
) -> _Plan:
    """The protocol's one generator and each bucket's place in its stream (recbole: a draw per row;
    strong_generalization: held-out users drawn first, then a draw per bucket with held-out rows)."""
    rng = np.random.default_rng(seed)
    heldout, train_items, options = None, None, {}
    used_user, used_item = keep_user, keep_item
    draws = np.bincount(user_bucket, weights=user_counts, minlength=buckets.num_buckets)
    if protocol == "strong_generalization":
        options = {"num_heldout_users": int(num_heldout_users), "drop_unseen_items": True}
        heldout = draw_heldout_users(np.flatnonzero(keep_user), rng, num_heldout_users)
        used_user, used_item, draws = _strong_generalization_use(
            frames(pool, buckets, ahead), keep_user, keep_item, heldout, user_bucket, buckets.num_buckets
        )
        train_items = np.flatnonzero(used_item)
    return _Plan(
        keep_user=keep_user,
        keep_item=keep_item,
        used_user=used_user,
        used_item=used_item,
        new_user=np.cumsum(used_user) - 1,
        new_item=np.cumsum(used_item) - 1,
        state=rng.bit_generator.state,
        draws_before=(np.cumsum(draws) - draws).astype(np.int64),
        heldout=heldout,
        train_items=train_items,
        options=options,
    )


def _write_splits(
    pool, ahead: int, buckets: Buckets, files: dict[str, Path], plan: _Plan, protocol: str, filtered: bool
) -> dict[str, int]:
    """Last pass: each bucket split, in user order, into the split files; their row counts."""

    def split_bucket(b: int) -> list[pd.DataFrame]:
        df = buckets.load(b)
        if filtered:
            df = df[plan.keep_user[df["user_id"].to_numpy()] & plan.keep_item[df["item_id"].to_numpy()]]
        if len(df) == 0:
            return []
        rng = _generator_at(plan.state, int(plan.draws_before[b]))
        parts = _split(df, protocol, rng, plan.heldout, plan.train_items)
        for part in parts:
            part["user_id"] = plan.new_user[part["user_id"].to_numpy()]
            part["item_id"] = plan.new_item[part["item_id"].to_numpy()]
        return parts

    sizes = int(plan.used_user.sum()), int(plan.used_item.sum())
    writers = {s: InteractionsFileWriter(files[s], s, *sizes) for s in _SPLITS}
    try:
        for parts in in_order(pool, split_bucket, range(buckets.num_buckets), ahead):
            for s, part in zip(_SPLITS, parts):
                writers[s].append(part)
    finally:
        counts = {s: w.num_rows for s, w in writers.items()}
        for w in writers.values():
            w.close(allow_empty=True)
    return counts


def _strong_generalization_use(
    frames: Iterable[pd.DataFrame], keep_user, keep_item, heldout, user_bucket, num_buckets: int
):
    """Users and items left once held-out users' rows with items no training user has are dropped
    (Liang's rule), and each bucket's held-out rows (one draw each): the training users' items come
    from every bucket, so the frames are read into memory only when they are already there."""
    is_heldout = np.zeros(len(keep_user), dtype=bool)
    is_heldout[np.concatenate(heldout)] = True
    train_item = np.zeros(len(keep_item), dtype=bool)
    used_user = keep_user & ~is_heldout
    heldout_rows = []  # (user_id, item_id) of kept held-out rows, a small share of the log
    for df in frames:
        u, i = df["user_id"].to_numpy(), df["item_id"].to_numpy()
        kept = keep_user[u] & keep_item[i]
        train_item[i[kept & ~is_heldout[u]]] = True
        m = kept & is_heldout[u]
        heldout_rows.append((u[m], i[m]))
    draws = np.zeros(num_buckets, np.int64)  # one per bucket, empty ones too (a heavy user fills several)
    for u, i in heldout_rows:
        m = train_item[i]
        used_user[u[m]] = True
        draws += np.bincount(user_bucket[u[m]], minlength=len(draws))
    return used_user, train_item, draws


def _split(df: pd.DataFrame, protocol: str, rng: np.random.Generator, heldout, train_items):
    if protocol == "recbole":
        return split_recbole(df, seed=0, rng=rng)
    if protocol == "loo":
        return split_loo(df)
    if protocol == "strong_generalization":
        valid_users, test_users = heldout
        return split_heldout_users(
            df, valid_users=valid_users, test_users=test_users, rng=rng, drop_unseen_items=True, train_items=train_items
        )
    raise ValueError(f"unknown split protocol {protocol!r}; known: recbole, loo, strong_generalization")
