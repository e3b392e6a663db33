"""The one reader of a prepared dataset dir (layout and file names: data_pipelines/dataset_dir.py).

:func:`read_dataset_meta` (meta.json), :func:`load_dataset` (splits and items as flat numpy
arrays, optionally one rank's users only) and :func:`read_vocabularies` (raw ids and titles, when
the dir has them). Every id is checked against the sizes in meta.json here, once, with an error
naming the file, column and value; batches re-check their features before each lookup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.dataset_dir import (
    HELDOUT_USERS_FILE,
    ITEMS_FILE,
    ITEMS_VOCAB,
    META_FILE,
    SPLITS,
    USERS_VOCAB,
    split_file,
)
from recsys.data.dataset_checks import check_meta_counts


@dataclass(frozen=True)
class Interactions:
    """One split, sorted by (user_id, timestamp, item_id); all arrays have the same length."""

    user_ids: np.ndarray  # int64
    item_ids: np.ndarray  # int64
    timestamps: np.ndarray  # int64, epoch time in meta.json's unit (or file order): only their order is read

    def __len__(self) -> int:
        return int(self.user_ids.shape[0])

    def user_bounds(self, num_users: int) -> np.ndarray:
        """``indptr`` (num_users + 1): user u's rows are [indptr[u], indptr[u+1])."""
        return np.searchsorted(self.user_ids, np.arange(num_users + 1, dtype=np.int64))

    @staticmethod
    def concat(a: Interactions, b: Interactions) -> Interactions:
        users = np.concatenate([a.user_ids, b.user_ids])
        items = np.concatenate([a.item_ids, b.item_ids])
        times = np.concatenate([a.timestamps, b.timestamps])
        order = np.lexsort((items, times, users))
        return Interactions(users[order], items[order], times[order])


@dataclass(frozen=True)
class RetrievalData:
    dir: Path
    meta: dict
    num_users: int
    num_items: int
    num_categories: int
    splits: dict[str, Interactions]
    item_category_indptr: np.ndarray  # num_items + 1
    item_category_ids: np.ndarray  # categories of item i: ids[indptr[i]:indptr[i+1]]
    heldout_users: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # strong_generalization
    # set when only users [lo, hi) were read (data.shard_by_user): splits hold those users' rows only
    user_range: tuple[int, int] | None = None
    # training frequency of every item over the whole split, when splits hold a part of it
    global_item_counts: np.ndarray | None = None
    # each item's co-occurrence neighbours (recsys.data.neighbors; data.item_neighbors > 0):
    # item i's are ids[indptr[i]:indptr[i+1]]
    item_neighbor_indptr: np.ndarray | None = None
    item_neighbor_ids: np.ndarray | None = None
    # model.features' columns (recsys.data.side_features.SideFeature), set by with_side_features; () = none
    side_features: tuple = ()
    # the valid split's rows were moved into train (data.train_on_valid, with_valid_in_train)
    valid_in_train: bool = False
    # data.slices (recsys/data/slices.py): train rows before this time are history only, never training examples
    example_since: int | None = None
    slice_bounds: np.ndarray | None = None  # the windows' time bounds (data.slices + 1), when sliced
    # model.id_mapping=managed (recsys/data/raw_ids.py): the raw 64-bit id of every user / item index, which the
    # batches hand to the managed tables instead of the index
    raw_user_ids: np.ndarray | None = None
    raw_item_ids: np.ndarray | None = None

    def is_heldout(self, user_ids: np.ndarray) -> np.ndarray:
        """Whether each user is a held-out (valid / test) user whose train rows are fold-in history only."""
        return np.isin(user_ids, self.heldout_users)  # O(rows + held-out users), not O(num_users)

    @property
    def has_categories(self) -> bool:
        return self.num_categories > 0

    @property
    def has_neighbors(self) -> bool:
        return self.item_neighbor_indptr is not None

    @property
    def table_num_rows(self) -> dict[str, int]:
        """Rows of each table the data feeds (no category table when items have no categories, a
        neighbour table only when the items' neighbours were computed), then the side features' tables
        in order of first use, each as large as the largest of its features' columns needs."""
        rows = {"user": self.num_users, "item": self.num_items}
        if self.has_categories:
            rows["category"] = self.num_categories
        if self.has_neighbors:
            rows["neighbor"] = self.num_items
        for f in self.side_features:
            rows[f.table] = max(rows.get(f.table, 0), f.num_ids)
        return rows

    def example_rows(self) -> np.ndarray:
        """Rows of the training split that are training examples: not a held-out user's fold-in history, nor
        (data.slices) a row from before the slice's examples start."""
        train = self.splits["train"]
        keep = ~self.is_heldout(train.user_ids)
        if self.example_since is not None:
            keep &= train.timestamps >= self.example_since
        return np.nonzero(keep)[0]

    def example_item_counts(self) -> np.ndarray:
        """Every item's frequency among the training examples (the logQ estimate of the items a batch samples):
        ``item_counts()``, except that with data.slices only the slice's examples count, not its history rows."""
        if self.example_since is None:
            return self.item_counts()
        train = self.splits["train"]
        return np.bincount(train.item_ids[train.timestamps >= self.example_since], minlength=self.num_items)

    def item_counts(self) -> np.ndarray:
        """Training frequency of every item (the logQ estimate and the popularity baseline).

        With a user range loaded, the whole split's counts must have been set (``global_item_counts``).
        """
        if self.global_item_counts is not None:
            return self.global_item_counts
        if self.user_range is not None:
            raise RuntimeError("item_counts of a user shard: set global_item_counts (a sum over all shards) first")
        return np.bincount(self.splits["train"].item_ids, minlength=self.num_items)


def with_valid_in_train(data: RetrievalData) -> RetrievalData:
    """``data`` with the valid split's rows in train and an empty valid split (data.train_on_valid: the
    refit after model selection). Item counts, and so the logQ estimate and popularity, follow train."""
    if data.valid_in_train:
        return data
    if data.has_neighbors or data.global_item_counts is not None:
        raise RuntimeError("with_valid_in_train: merge before computing neighbours or global item counts")
    splits = data.splits
    empty = Interactions(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    merged = {**splits, "train": Interactions.concat(splits["train"], splits["valid"]), "valid": empty}
    meta = data.meta
    if "counts" in meta:  # the whole split's rows (also when this rank holds some users only)
        counts = meta["counts"]
        meta = {**meta, "counts": {**counts, "train": counts["train"] + counts["valid"], "valid": 0}}
    return replace(data, meta=meta, splits=merged, valid_in_train=True)


def _check_range(path: Path, column: str, values: np.ndarray, size: int) -> None:
    if values.size == 0:
        return
    bad = values[(values < 0) | (values >= size)]
    if bad.size:
        raise ValueError(f"{path}: column '{column}' has id {int(bad[0])} outside [0, {size}) (from meta.json)")


def _read_parquet(path: Path, columns: list[str], filters=None) -> pa.Table:
    """``columns`` of a dataset dir's parquet file, or an error naming the file and what is wrong with it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; prepare the dataset again (python -m data_pipelines.prepare)")
    try:
        names = pq.ParquetFile(path).schema_arrow.names
        for column in columns:
            if column not in names:
                raise ValueError(f"{path}: no column '{column}' (columns: {names})")
        return pq.read_table(path, columns=columns, filters=filters)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable parquet file ({e}); prepare the dataset again") from None


def read_split(root: Path, split: str, num_users: int, num_items: int) -> Interactions:
    """One whole split of the dataset dir at ``root`` (every user's rows), checked like ``load_dataset``'s."""
    return _read_split(Path(root) / split_file(split), num_users, num_items)


def _read_split(path: Path, num_users: int, num_items: int, user_range: tuple[int, int] | None = None) -> Interactions:
    filters = None
    if user_range is not None:  # row groups whose user_id statistics miss the range are never read
        filters = [("user_id", ">=", int(user_range[0])), ("user_id", "<", int(user_range[1]))]
    table = _read_parquet(path, ["user_id", "item_id", "timestamp"], filters)
    users = table.column("user_id").to_numpy().astype(np.int64, copy=False)
    items = table.column("item_id").to_numpy().astype(np.int64, copy=False)
    times = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
    _check_range(path, "user_id", users, num_users)
    _check_range(path, "item_id", items, num_items)
    order = np.lexsort((items, times, users))
    return Interactions(users[order], items[order], times[order])


def user_boundaries(train_path: str | Path, world_size: int, num_users: int) -> list[int]:
    """Split users into ``world_size`` contiguous ranges holding about equal training rows.

    Returns ``world_size + 1`` non-decreasing user ids; rank r owns users ``[b[r], b[r + 1])``.
    ``b[r]`` is the user of row ``r * N // world_size`` of the (user-sorted) split, found from the
    parquet metadata plus that one row group's user_id column: nothing else is read.
    """
    file = pq.ParquetFile(train_path)
    meta = file.metadata
    group_starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    bounds = [0]
    for r in range(1, world_size):
        row = r * meta.num_rows // world_size
        group = int(np.searchsorted(group_starts, row, side="right") - 1)
        users = file.read_row_group(group, columns=["user_id"]).column(0).to_numpy()
        bounds.append(max(bounds[-1], int(users[row - group_starts[group]])))
    bounds.append(num_users)
    return bounds


def _meta_count(meta_path: Path, meta: dict, key: str) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{meta_path}: '{key}' is {value!r}, expected a non-negative integer")
    return value


def read_dataset_meta(root: Path, *, required: bool = True) -> dict:
    """``<root>/meta.json``, its counts (num_users, num_items, num_categories) checked to be non-negative integers.

    ``required=False``: what the file holds, unchecked, or ``{}`` without one (the report's optional context).
    """
    meta_path = root / META_FILE
    if not required:
        return json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{meta_path}: missing; is {root} a prepared dataset dir?") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from None
    for key in ("num_users", "num_items", "num_categories"):
        _meta_count(meta_path, meta, key)
    return meta


def load_dataset(path: str | Path, user_range: tuple[int, int] | None = None) -> RetrievalData:
    """The dataset dir at ``path``; with ``user_range=(lo, hi)`` only the rows of users lo..hi-1 of
    every split (items, heldout users and counts in meta.json are always whole)."""
    root = Path(path).resolve()
    meta = read_dataset_meta(root)
    num_users, num_items, num_categories = (meta[k] for k in ("num_users", "num_items", "num_categories"))
    check_meta_counts(root, meta)  # every count in meta.json against its file, and an empty train split by name
    splits = {s: _read_split(root / split_file(s), num_users, num_items, user_range) for s in SPLITS}

    items_path = root / ITEMS_FILE
    items = _read_parquet(items_path, ["item_id", "categories"])
    item_ids = items.column("item_id").to_numpy()
    if not np.array_equal(item_ids, np.arange(num_items)):
        raise ValueError(f"{items_path}: column 'item_id' must list 0..{num_items - 1} in order")
    categories = items.column("categories").combine_chunks()
    indptr = categories.offsets.to_numpy().astype(np.int64)
    indptr = indptr - indptr[0]
    category_ids = categories.flatten().to_numpy().astype(np.int64, copy=False)
    _check_range(items_path, "categories", category_ids, num_categories)
    heldout_path = root / HELDOUT_USERS_FILE
    heldout = np.zeros(0, dtype=np.int64)
    if heldout_path.exists():
        heldout = _read_parquet(heldout_path, ["user_id"]).column("user_id").to_numpy().astype(np.int64)
        _check_range(heldout_path, "user_id", heldout, num_users)
    return RetrievalData(
        root,
        meta,
        num_users,
        num_items,
        num_categories,
        splits,
        indptr,
        category_ids,
        heldout,
        user_range=None if user_range is None else (int(user_range[0]), int(user_range[1])),
    )


@dataclass(frozen=True)
class Vocabularies:
    """What the dataset dir knows of its ids beyond the indices, each ``None`` where it does not say."""

    user_raw: np.ndarray | None  # object [num_users]: raw user id of each index
    item_raw: np.ndarray | None  # object [num_items]: raw item id of each index
    titles: np.ndarray | None  # object [num_items]: item titles (the items vocabulary's, else items.parquet's)


def _optional_parquet(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def _by_id(df: pd.DataFrame | None, id_col: str, value_col: str, n: int) -> np.ndarray | None:
    """``out[id] = value`` over ids [0, n), or None if the columns are missing or do not cover every id."""
    if df is None or id_col not in df.columns or value_col not in df.columns:
        return None
    ids = df[id_col].to_numpy()
    if ids.size == 0 or ids.min() < 0 or ids.max() >= n:
        return None
    out = np.full(n, None, dtype=object)
    out[ids] = df[value_col].to_numpy()
    return out


def read_vocabularies(root: str | Path, num_users: int, num_items: int) -> Vocabularies:
    """Raw ids and titles from ``vocab/users.parquet``, ``vocab/items.parquet`` and ``items.parquet``, where present."""
    root = Path(root)
    users_vocab = _optional_parquet(root / USERS_VOCAB)
    items_vocab = _optional_parquet(root / ITEMS_VOCAB)
    titles = _by_id(items_vocab, "item_id", "title", num_items)
    if titles is None:
        titles = _by_id(_optional_parquet(root / ITEMS_FILE), "item_id", "title", num_items)
    return Vocabularies(
        user_raw=_by_id(users_vocab, "user_id", "raw_id", num_users),
        item_raw=_by_id(items_vocab, "item_id", "raw_id", num_items),
        titles=titles,
    )
