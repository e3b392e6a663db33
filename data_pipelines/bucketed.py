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
tests/test_out_of_core.py). Memory: O(distinct users + items) for the vocabularies and counts, plus
one bucket (``memory_budget_bytes / _BUCKET_BYTES_PER_ROW`` rows) at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from data_pipelines.dataset_dir import InteractionsFileWriter
from data_pipelines.errors import DatasetError
from data_pipelines.spill import BatchStore
from data_pipelines.splits import (
    draw_heldout_users,
    filter_interactions,
    split_heldout_users,
    split_loo,
    split_recbole,
)
from data_pipelines.vocab import IdMapper, VocabBuilder

__all__ = ["BucketedSplit", "split_log"]

# Peak bytes per row while a bucket is deduplicated and split (its columns, sort keys, the split's
# copies and the writers' row groups); measured on the 25M-row bench, rounded up.
_BUCKET_BYTES_PER_ROW = 160
_LOG_STORE_SHARE = 4  # the parsed log stays in memory up to budget / 4 bytes, then goes to disk
_COLUMNS = ("user_id", "item_id", "timestamp", "rating")


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


class _Buckets:
    """The log's rows by bucket of users, each bucket a store (all in memory when there is one)."""

    def __init__(self, work: Path, num_buckets: int) -> None:
        budget = 1 << 62 if num_buckets == 1 else 0  # one bucket stays in memory; several go to disk
        self.stores = [BatchStore(work / f"bucket-{b:05d}.arrow", budget) for b in range(num_buckets)]

    def frames(self) -> Iterable[tuple[int, pd.DataFrame]]:
        for b, store in enumerate(self.stores):
            table = store.table()
            if table is not None:
                yield b, pd.DataFrame({c: table[c].to_numpy() for c in _COLUMNS}, copy=False)

    def replace(self, b: int, df: pd.DataFrame) -> None:
        self.stores[b].replace(pa.Table.from_pandas(df, preserve_index=False))


def _read(batches: Iterable[pa.RecordBatch], store: BatchStore, min_rating: float):
    """Pass 1: rows with rating >= min_rating into ``store``; the vocabularies; the raw row count."""
    users, items = VocabBuilder(), VocabBuilder()
    num_raw = 0
    for batch in batches:
        num_raw += batch.num_rows
        if min_rating > 0:
            batch = batch.filter(np.asarray(batch["rating"].to_numpy()) >= min_rating)
        if batch.num_rows:
            users.add(batch["user"])
            items.add(batch["item"])
            store.append(batch)
    return users.finish(), items.finish()[0], num_raw


def _partition(store: BatchStore, buckets: _Buckets, users: IdMapper, items: IdMapper, user_bucket: np.ndarray):
    """Pass 2: raw ids -> indices, each row to its user's bucket (rows keep their file order)."""
    schema = pa.schema(
        [("user_id", pa.int64()), ("item_id", pa.int64()), ("timestamp", pa.int64()), ("rating", pa.float32())]
    )
    for batch in store.batches():
        u, i = users(batch["user"]), items(batch["item"])
        columns = [u, i, np.asarray(batch["timestamp"].to_numpy()), np.asarray(batch["rating"].to_numpy())]
        if len(buckets.stores) == 1:
            buckets.stores[0].append(pa.RecordBatch.from_arrays([pa.array(c) for c in columns], schema=schema))
            continue
        b = user_bucket[u]
        order = np.argsort(b, kind="stable")
        bounds = np.searchsorted(b[order], np.arange(len(buckets.stores) + 1))
        for k in np.flatnonzero(np.diff(bounds)):
            rows = order[bounds[k] : bounds[k + 1]]
            buckets.stores[k].append(pa.RecordBatch.from_arrays([pa.array(c[rows]) for c in columns], schema=schema))
    store.clear()


def _counts(buckets: _Buckets, num_users: int, num_items: int, keep_user=None, keep_item=None):
    """Rows per user and per item over every bucket, of the rows whose user and item are kept."""
    user_counts, item_counts = np.zeros(num_users, np.int64), np.zeros(num_items, np.int64)
    for _, df in buckets.frames():
        u, i = df["user_id"].to_numpy(), df["item_id"].to_numpy()
        if keep_user is not None:
            m = keep_user[u] & keep_item[i]
            u, i = u[m], i[m]
        user_counts += np.bincount(u, minlength=num_users)
        item_counts += np.bincount(i, minlength=num_items)
    return user_counts, item_counts


def _dedupe(buckets: _Buckets, num_users: int, num_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass 3: one row per (user, item) in every bucket (the latest); rows per user and per item."""
    user_counts, item_counts = np.zeros(num_users, np.int64), np.zeros(num_items, np.int64)
    for b, df in list(buckets.frames()):
        kept = filter_interactions(df)
        if len(kept) < len(df):
            buckets.replace(b, kept)
        user_counts += np.bincount(kept["user_id"].to_numpy(), minlength=num_users)
        item_counts += np.bincount(kept["item_id"].to_numpy(), minlength=num_items)
    return user_counts, item_counts


def _k_core(buckets: _Buckets, user_counts, item_counts, min_user: int, min_item: int):
    """Users and items left by the k-core (``filter_interactions``'s rounds, one pass over the buckets
    each): masks over the indices, and their final row counts."""
    while True:
        keep_user = (user_counts > 0) & (user_counts >= min_user)
        keep_item = (item_counts > 0) & (item_counts >= min_item)
        if not ((user_counts > 0) & ~keep_user).any() and not ((item_counts > 0) & ~keep_item).any():
            return keep_user, keep_item, user_counts
        user_counts, item_counts = _counts(buckets, len(user_counts), len(item_counts), keep_user, keep_item)


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
) -> BucketedSplit:
    """Filter and split the log in ``batches`` (columns user, item, timestamp, rating) by ``protocol``
    (recbole | loo | strong_generalization), writing the split files into ``work`` (spill files too)."""
    log = BatchStore(work / "log.arrow", memory_budget_bytes // _LOG_STORE_SHARE)
    (raw_users, rows_per_user), raw_items, num_raw = _read(batches, log, filters["min_rating"])
    if log.num_rows == 0:
        raise DatasetError(f"{label}: no interactions left after the filters {filters} (of {num_raw})")
    bucket_rows = max(memory_budget_bytes // _BUCKET_BYTES_PER_ROW, 1)
    num_buckets = 1 if not log.on_disk and log.num_rows <= bucket_rows else -(-log.num_rows // bucket_rows)
    rows_before = np.cumsum(rows_per_user) - rows_per_user  # contiguous user ranges of ~equal rows
    user_bucket = rows_before * num_buckets // log.num_rows
    buckets = _Buckets(work, num_buckets)
    _partition(log, buckets, IdMapper(raw_users), IdMapper(raw_items), user_bucket)
    num_users, num_items = len(raw_users), len(raw_items)

    user_counts, item_counts = _dedupe(buckets, num_users, num_items)
    min_user, min_item = filters["min_user_interactions"], filters["min_item_interactions"]
    keep_user, keep_item, user_counts = _k_core(buckets, user_counts, item_counts, min_user, min_item)
    if not keep_user.any():
        raise DatasetError(f"{label}: no interactions left after the filters {filters} (of {num_raw})")
    filtered = min_user > 0 or min_item > 0

    rng = np.random.default_rng(seed)
    heldout, train_items, options = None, None, {}
    used_user, used_item = keep_user, keep_item
    if protocol == "strong_generalization":
        options = {"num_heldout_users": int(num_heldout_users), "drop_unseen_items": True}
        heldout = draw_heldout_users(np.flatnonzero(keep_user), rng, num_heldout_users)
        used_user, used_item = _strong_generalization_use(buckets, keep_user, keep_item, heldout)
        train_items = np.flatnonzero(used_item)

    new_user, new_item = np.cumsum(used_user) - 1, np.cumsum(used_item) - 1  # compacted ids
    sizes = int(used_user.sum()), int(used_item.sum())
    names = ("train", "valid", "test")
    files = {s: work / f"{s}.parquet" for s in names}
    writers = {s: InteractionsFileWriter(files[s], s, *sizes) for s in names}
    try:
        for _, df in buckets.frames():
            if filtered:
                df = df[keep_user[df["user_id"].to_numpy()] & keep_item[df["item_id"].to_numpy()]]
            if len(df) == 0:
                continue
            for s, part in zip(names, _split(df, protocol, rng, heldout, train_items)):
                part["user_id"] = new_user[part["user_id"].to_numpy()]
                part["item_id"] = new_item[part["item_id"].to_numpy()]
                writers[s].append(part)
    finally:
        counts = {s: w.num_rows for s, w in writers.items()}
        for w in writers.values():
            w.close(allow_empty=True)
    if heldout is not None:
        heldout = tuple(new_user[h][used_user[h]] for h in heldout)
    return BucketedSplit(
        files=files,
        counts=counts,
        users=raw_users.take(pa.array(np.flatnonzero(used_user))),
        items=raw_items.take(pa.array(np.flatnonzero(used_item))),
        num_raw_interactions=num_raw,
        num_buckets=num_buckets,
        heldout=heldout,
        options=options,
    )


def _strong_generalization_use(buckets: _Buckets, keep_user, keep_item, heldout):
    """Users and items left once held-out users' rows with items no training user has are dropped
    (Liang's rule): two passes, one for the training users' items, one for the held-out users."""
    is_heldout = np.zeros(len(keep_user), dtype=bool)
    is_heldout[np.concatenate(heldout)] = True
    train_item = np.zeros(len(keep_item), dtype=bool)
    used_user = keep_user & ~is_heldout
    for _, df in buckets.frames():
        u, i = df["user_id"].to_numpy(), df["item_id"].to_numpy()
        m = used_user[u] & keep_item[i]
        train_item[i[m]] = True
    for _, df in buckets.frames():
        u, i = df["user_id"].to_numpy(), df["item_id"].to_numpy()
        m = is_heldout[u] & keep_user[u] & train_item[i]
        used_user[u[m]] = True
    return used_user, train_item


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
