"""The passes of ``bucketed.split_log`` before the protocol: the log read once into a store (min
rating, vocabularies), its rows partitioned into buckets of whole users (in memory or one Arrow IPC
file each), deduplicated, and the k-core's row counts, one pass over the buckets each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.filters import filter_interactions
from data_pipelines.spill import BatchStore
from data_pipelines.vocab import IdMapper, VocabBuilder

_RELEASE_EVERY_BATCHES = 8  # reused pages are far cheaper than fresh ones from the kernel: free the pool rarely
_COLUMNS = ("user_id", "item_id", "timestamp", "rating")
_SCHEMA = pa.schema(
    [("user_id", pa.int64()), ("item_id", pa.int64()), ("timestamp", pa.int64()), ("rating", pa.float32())]
)


class Buckets:
    """The log's rows by bucket of users: frames in memory, or one Arrow IPC file each on disk."""

    def __init__(self, work: Path, num_buckets: int, in_memory: bool) -> None:
        self.num_buckets, self.in_memory = num_buckets, in_memory
        self._pieces: list[list[dict[str, np.ndarray]]] = [[] for _ in range(num_buckets)]
        self._frames: list[pd.DataFrame | None] = [None] * num_buckets
        self._stores = [BatchStore(work / f"bucket-{b:05d}.arrow", 0) for b in range(num_buckets)]

    def append(self, b: int, columns: dict[str, np.ndarray]) -> None:
        if self.in_memory:
            self._pieces[b].append(columns)
        else:
            self._stores[b].append(pa.RecordBatch.from_arrays([pa.array(columns[c]) for c in _COLUMNS], schema=_SCHEMA))

    def load(self, b: int) -> pd.DataFrame:
        if self.in_memory:
            if self._frames[b] is None:
                pieces, self._pieces[b] = self._pieces[b], []
                self._frames[b] = pd.DataFrame(
                    {c: np.concatenate([p[c] for p in pieces]) if len(pieces) != 1 else pieces[0][c] for c in _COLUMNS}
                    if pieces
                    else {c: np.zeros(0, t.to_pandas_dtype()) for c, t in zip(_COLUMNS, _SCHEMA.types)},
                    copy=False,
                )
            return self._frames[b]
        table = self._stores[b].table()
        if table is None:
            return pd.DataFrame({c: np.zeros(0, t.to_pandas_dtype()) for c, t in zip(_COLUMNS, _SCHEMA.types)})
        return pd.DataFrame({c: table[c].to_numpy() for c in _COLUMNS}, copy=False)

    def save(self, b: int, df: pd.DataFrame) -> None:
        if self.in_memory:
            self._frames[b] = df
        else:
            self._stores[b].replace(pa.Table.from_pandas(df[list(_COLUMNS)], preserve_index=False))


def in_order(pool: ThreadPoolExecutor, fn, items, ahead: int):
    """``map(fn, items)`` on ``pool`` with at most ``ahead`` calls in flight, results in order (bounded memory)."""
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def read_log(batches: Iterable[pa.RecordBatch], store: BatchStore, min_rating: float):
    """Pass 1: rows with rating >= min_rating into ``store``; the vocabularies; the raw row count."""
    users, items = VocabBuilder(), VocabBuilder()
    num_raw = 0
    text: set[str] = set()  # id columns the store holds as strings
    for j, batch in enumerate(batches):
        num_raw += batch.num_rows
        if min_rating > 0:
            batch = batch.filter(np.asarray(batch["rating"].to_numpy()) >= min_rating)
        if batch.num_rows:
            batch = _one_id_type(batch, store, text)
            users.add(batch["user"])
            items.add(batch["item"])
            store.append(batch)
        if j % _RELEASE_EVERY_BATCHES == _RELEASE_EVERY_BATCHES - 1:
            pa.default_memory_pool().release_unused()  # freed batches' pages back to the OS: numpy reuses them
    pa.default_memory_pool().release_unused()
    return users.finish(), items.finish()[0], num_raw


def _as_text(batch: pa.RecordBatch, column: str) -> pa.RecordBatch:
    i = batch.schema.get_field_index(column)
    return batch.set_column(i, column, pc.cast(batch.column(i), pa.string()))


def _one_id_type(batch: pa.RecordBatch, store: BatchStore, text: set[str]) -> pa.RecordBatch:
    """``batch`` with the id types of the batches in ``store``: a column is int64 until a batch brings
    text ids, then strings, the integers held so far turned into their decimal text (``log_columns.ids``:
    the same ids)."""
    for column in ("user", "item"):
        if pa.types.is_integer(batch.schema.field(column).type):
            if column in text:
                batch = _as_text(batch, column)
        elif column not in text:
            text.add(column)
            store.map(lambda b, c=column: _as_text(b, c))
    return batch


def partition(store: BatchStore, buckets: Buckets, users: IdMapper, items: IdMapper, user_bucket: np.ndarray):
    """Pass 2: raw ids -> indices, each row to its user's bucket (rows keep their file order)."""
    for batch in store.batches():
        u = users(batch["user"])
        columns = {
            "user_id": u,
            "item_id": items(batch["item"]),
            "timestamp": np.asarray(batch["timestamp"].to_numpy()),
            "rating": np.asarray(batch["rating"].to_numpy()),
        }
        b = user_bucket[u]
        if (b[1:] >= b[:-1]).all():  # a log grouped by user: each bucket's rows are one slice
            bounds = np.searchsorted(b, np.arange(buckets.num_buckets + 1))
            rows = [slice(bounds[k], bounds[k + 1]) for k in range(buckets.num_buckets)]
        else:
            order = np.argsort(b, kind="stable")  # a radix sort of small integers
            bounds = np.searchsorted(b[order], np.arange(buckets.num_buckets + 1))
            rows = [order[bounds[k] : bounds[k + 1]] for k in range(buckets.num_buckets)]
        for k, r in enumerate(rows):
            if bounds[k + 1] > bounds[k]:
                buckets.append(k, {c: v[r] for c, v in columns.items()})
    store.clear()


def _counts(frames: Iterable[pd.DataFrame], num_users: int, num_items: int, keep_user=None, keep_item=None):
    """Rows per user and per item over every bucket, of the rows whose user and item are kept."""
    user_counts, item_counts = np.zeros(num_users, np.int64), np.zeros(num_items, np.int64)
    for df in frames:
        u, i = df["user_id"].to_numpy(), df["item_id"].to_numpy()
        if keep_user is not None:
            m = keep_user[u] & keep_item[i]
            u, i = u[m], i[m]
        user_counts += np.bincount(u, minlength=num_users)
        item_counts += np.bincount(i, minlength=num_items)
    return user_counts, item_counts


def frames(pool: ThreadPoolExecutor, buckets: Buckets, ahead: int) -> Iterable[pd.DataFrame]:
    return in_order(pool, buckets.load, range(buckets.num_buckets), ahead)


def dedupe(pool: ThreadPoolExecutor, ahead: int, buckets: Buckets, num_users: int, num_items: int):
    """Pass 3: one row per (user, item) in every bucket (the latest); rows per user and per item."""

    def one(b: int) -> pd.DataFrame:
        df = buckets.load(b)
        kept = filter_interactions(df)
        if len(kept) < len(df):
            buckets.save(b, kept)
        return kept

    return _counts(in_order(pool, one, range(buckets.num_buckets), ahead), num_users, num_items)


def k_core(pool, ahead: int, buckets: Buckets, user_counts, item_counts, min_user: int, min_item: int):
    """Users and items left by the k-core (``filter_interactions``'s rounds, one pass over the buckets
    each): masks over the indices, and their final row counts."""
    while True:
        keep_user = (user_counts > 0) & (user_counts >= min_user)
        keep_item = (item_counts > 0) & (item_counts >= min_item)
        if not ((user_counts > 0) & ~keep_user).any() and not ((item_counts > 0) & ~keep_item).any():
            return keep_user, keep_item, user_counts
        user_counts, item_counts = _counts(
            frames(pool, buckets, ahead), len(user_counts), len(item_counts), keep_user, keep_item
        )
