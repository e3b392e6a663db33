"""Writing a dataset dir (layout: ``dataset_dir``): every frame validated against the contract, then
written with fixed settings into a temporary folder renamed into place (``write_dataset_dir``); a
split larger than memory chunk by chunk (``InteractionsFileWriter``), the same bytes.
Output is deterministic: the same frames give byte-identical files (for one pyarrow version).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.atomic import staged
from data_pipelines.dataset_dir import (
    INTERACTION_SCHEMA,
    ITEMS_FILE,
    META_FILE,
    REQUIRED_META,
    USERS_FILE,
    split_file,
)
from data_pipelines.file_sizes import file_sizes
from data_pipelines.rows import lexsort_order

__all__ = ["InteractionsFileWriter", "write_dataset_dir"]

# Fixed writer settings: byte-identical output depends on them, so they are not parameters.
_WRITE_OPTIONS: dict[str, Any] = dict(
    compression="zstd",
    compression_level=3,
    row_group_size=1 << 20,  # rows; ML-1M's train split fits in one group
    use_dictionary=True,
    write_statistics=True,
    version="2.6",
    data_page_version="1.0",
)
# train/valid/test: timestamps are near-unique, so a dictionary only costs time (Arrow builds one,
# overflows its page limit and falls back); delta encoding is faster and smaller
_INTERACTION_WRITE_OPTIONS: dict[str, Any] = dict(
    _WRITE_OPTIONS,
    use_dictionary=["user_id", "item_id", "rating"],
    column_encoding={"timestamp": "DELTA_BINARY_PACKED"},
)
_ROW_GROUP_ROWS = _WRITE_OPTIONS["row_group_size"]
_BACKGROUND_WRITE_ROWS = 1 << 20  # rows; a file this big is written on its own thread (ML-25M's train)


# ---------------------------------------------------------------- validation


def _int_column(df: pd.DataFrame, table: str, column: str) -> np.ndarray:
    if column not in df.columns:
        raise ValueError(f"{table}: missing column {column!r}; have {list(df.columns)}")
    values = df[column]
    if not pd.api.types.is_integer_dtype(values.dtype):
        raise ValueError(f"{table}.{column}: expected an integer dtype, got {values.dtype}")
    return values.to_numpy(dtype=np.int64)


def _check_range(values: np.ndarray, table: str, column: str, upper: int) -> None:
    bad = (values < 0) | (values >= upper)
    if bad.any():
        raise ValueError(
            f"{table}.{column}: value {int(values[np.argmax(bad)])} out of range [0, {upper}) "
            f"({int(bad.sum())} bad row(s))"
        )


def _interactions_table(df: pd.DataFrame, split: str, num_users: int, num_items: int) -> pa.Table:
    if len(df) == 0:
        raise ValueError(f"{split}: split is empty")
    extra = sorted(set(df.columns) - set(INTERACTION_SCHEMA.names))
    if extra:
        raise ValueError(f"{split}: unexpected column(s) {extra}; expected {INTERACTION_SCHEMA.names}")
    user_ids = _int_column(df, split, "user_id")
    item_ids = _int_column(df, split, "item_id")
    timestamps = _int_column(df, split, "timestamp")
    _check_range(user_ids, split, "user_id", num_users)
    _check_range(item_ids, split, "item_id", num_items)
    if "rating" not in df.columns:
        raise ValueError(f"{split}: missing column 'rating'; have {list(df.columns)}")
    if not pd.api.types.is_numeric_dtype(df["rating"].dtype):
        raise ValueError(f"{split}.rating: expected a numeric dtype, got {df['rating'].dtype}")
    ratings = df["rating"].to_numpy(dtype=np.float32)
    if not np.isfinite(ratings).all():
        raise ValueError(f"{split}.rating: non-finite value(s)")
    order = lexsort_order((item_ids, timestamps, user_ids))  # np.lexsort's order; None: already sorted
    arrays = [pa.array(a if order is None else a[order]) for a in (user_ids, item_ids, timestamps, ratings)]
    return pa.Table.from_arrays(arrays, schema=INTERACTION_SCHEMA)


def _check_dense_ids(df: pd.DataFrame, table: str, column: str, n: int) -> np.ndarray:
    ids = _int_column(df, table, column)
    if len(ids) != n or not np.array_equal(ids, np.arange(n)):
        first_bad = next((i for i, v in enumerate(ids[:n]) if v != i), min(len(ids), n))
        raise ValueError(
            f"{table}.{column}: must be exactly 0..{n - 1} in order ({n} rows), got {len(ids)} rows, "
            f"first mismatch at row {first_bad}"
        )
    return ids


def _side_table(df: pd.DataFrame, id_column: str) -> pa.Table:
    """``df`` as an Arrow table: the id column int64, other columns as pandas gives them, no pandas metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    table = table.set_column(
        table.schema.get_field_index(id_column), id_column, pa.array(df[id_column].to_numpy(np.int64))
    )
    return table


def _items_table(items: pd.DataFrame, num_items: int, num_categories: int) -> pa.Table:
    _check_dense_ids(items, "items", "item_id", num_items)
    if "categories" not in items.columns:
        raise ValueError(f"items: missing column 'categories'; have {list(items.columns)}")
    lists = [np.asarray(c, dtype=np.int64).reshape(-1) for c in items["categories"]]
    lengths = np.array([len(c) for c in lists], dtype=np.int64)
    if num_categories == 0:  # a dataset without categories (Gowalla): every list is empty, no table is built
        if lengths.any():
            raise ValueError(
                f"items.categories: item {int(np.argmax(lengths > 0))} has categories but meta.num_categories is 0"
            )
    elif (lengths == 0).any():
        raise ValueError(f"items.categories: item {int(np.argmax(lengths == 0))} has no categories")
    values = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
    _check_range(values, "items", "categories", num_categories)
    offsets = np.r_[0, np.cumsum(lengths)]
    within_list = np.ones(max(len(values) - 1, 0), dtype=bool)
    straddle = offsets[1:-1] - 1  # pairs that straddle two items
    within_list[straddle[(straddle >= 0) & (straddle < len(within_list))]] = False
    bad = within_list & (np.diff(values) <= 0)
    if bad.any():
        item_id = int(np.searchsorted(offsets, np.argmax(bad), side="right") - 1)
        raise ValueError(f"items.categories: item {item_id} has unsorted or duplicate ids {lists[item_id].tolist()}")
    categories = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    table = _side_table(items.drop(columns=["categories"]), "item_id")
    return table.add_column(1, pa.field("categories", pa.list_(pa.int64())), categories)


class InteractionsFileWriter:
    """One split's parquet file written chunk by chunk (a log larger than memory), the same bytes as
    ``write_dataset_dir`` writes for the whole frame: chunks are validated as it validates a frame
    and cut into the same row groups. Chunks must come in ascending ranges of users, each one
    sorted or not (it is sorted here). Row groups are encoded on a second thread.
    """

    def __init__(self, path: Path, split: str, num_users: int, num_items: int) -> None:
        self.path, self.split, self.num_users, self.num_items = path, split, num_users, num_items
        self.num_rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._last_user = -1
        self._writer = pq.ParquetWriter(path, INTERACTION_SCHEMA, **_writer_options(_INTERACTION_WRITE_OPTIONS))
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._encoding = None

    def append(self, df: pd.DataFrame) -> None:
        if len(df) == 0:
            return
        table = _interactions_table(df, self.split, self.num_users, self.num_items)
        first = table["user_id"][0].as_py()
        if first < self._last_user:
            raise ValueError(f"{self.split}: chunks out of user order (user {first} after {self._last_user})")
        self._last_user = table["user_id"][-1].as_py()
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.num_rows += table.num_rows
        while self._pending_rows >= _ROW_GROUP_ROWS:
            self._flush(_ROW_GROUP_ROWS)

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self._pending)
        group, rest = table.slice(0, rows).combine_chunks(), table.slice(rows)
        self._pending, self._pending_rows = [rest], rest.num_rows
        if self._encoding is not None:
            self._encoding.result()  # one row group in flight: bounded memory
        self._encoding = self._pool.submit(self._writer.write_table, group, row_group_size=_ROW_GROUP_ROWS)

    def close(self, *, allow_empty: bool = False) -> int:
        """Write what is left and close the file; its row count (0 an error unless ``allow_empty``)."""
        try:
            if self._pending_rows:
                self._flush(self._pending_rows)
            if self._encoding is not None:
                self._encoding.result()
        finally:
            self._pool.shutdown()
            self._writer.close()
        if self.num_rows == 0 and not allow_empty:
            raise ValueError(f"{self.split}: split is empty")
        return self.num_rows


def _writer_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "row_group_size"}


# ---------------------------------------------------------------- writing


def write_dataset_dir(
    out_dir: str | os.PathLike,
    *,
    train: pd.DataFrame | Path,
    valid: pd.DataFrame | Path,
    test: pd.DataFrame | Path,
    items: pd.DataFrame,
    users: pd.DataFrame,
    meta: Mapping[str, Any],
    extra_tables: Mapping[str, pd.DataFrame] | None = None,
) -> Path:
    """Validate and atomically write a dataset dir; returns its absolute path.

    ``meta`` must hold the keys listed in dataset_dir's docstring except ``counts``, which is
    computed here (if given it must match). ``extra_tables`` maps relative paths such as
    ``"vocab/items.parquet"`` to frames written as-is (index dropped). A split given as a path is a
    file an ``InteractionsFileWriter`` wrote (validated there) on the same file system: it is moved in.

    Everything is written to ``<out_dir>.tmp-<pid>-<random>``; then an existing ``out_dir``
    is renamed aside, the new one renamed in, and the old one deleted. On any exception the
    temporary folder is removed and an existing ``out_dir`` is left untouched.
    """
    out_dir = Path(out_dir).absolute()
    meta = dict(meta)
    num_users, num_items, num_categories = _sizes(meta)
    frames = {"train": train, "valid": valid, "test": test}
    written = {split_file(s): Path(f) for s, f in frames.items() if isinstance(f, Path)}
    tables = {
        split_file(s): _interactions_table(df, s, num_users, num_items)
        for s, df in frames.items()
        if not isinstance(df, Path)
    }
    interaction_files = set(tables)
    tables[ITEMS_FILE] = _items_table(items, num_items, num_categories)
    _check_dense_ids(users, "users", "user_id", num_users)
    tables[USERS_FILE] = _side_table(users, "user_id")
    tables.update(_extra_tables(extra_tables or {}))
    meta["counts"] = _counts(frames, meta)

    with staged(out_dir, "tmp") as tmp:
        tmp.mkdir()
        _write_tables(tmp, tables, interaction_files)
        for rel, f in written.items():
            os.replace(f, tmp / rel)
        meta["files"] = file_sizes(
            tmp, [*tables, *written]
        )  # what the cache check verifies (a truncated file is rebuilt)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")
    return out_dir


def _sizes(meta: dict[str, Any]) -> tuple[int, int, int]:
    """meta's num_users, num_items and num_categories, checked with its other required keys."""
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"meta: missing key(s) {missing}")
    num_users, num_items, num_categories = (int(meta[k]) for k in ("num_users", "num_items", "num_categories"))
    for key, n in (("num_users", num_users), ("num_items", num_items)):
        if n <= 0:
            raise ValueError(f"meta.{key}: must be positive, got {n}")
    if num_categories < 0:
        raise ValueError(f"meta.num_categories: must be >= 0 (0: items have no categories), got {num_categories}")
    return num_users, num_items, num_categories


def _extra_tables(extra_tables: Mapping[str, pd.DataFrame]) -> dict[str, pa.Table]:
    tables = {}
    for rel, df in extra_tables.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not rel.endswith(".parquet"):
            raise ValueError(f"extra_tables: {rel!r} must be a relative path ending in .parquet")
        tables[rel] = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    return tables


def _counts(frames: dict[str, pd.DataFrame | Path], meta: dict[str, Any]) -> dict[str, int]:
    """Rows per split; meta's ``counts``, when given, must agree."""
    counts = {s: pq.read_metadata(df).num_rows if isinstance(df, Path) else len(df) for s, df in frames.items()}
    if "counts" in meta and {k: int(v) for k, v in dict(meta["counts"]).items()} != counts:
        raise ValueError(f"meta.counts {meta['counts']} disagrees with the frames {counts}")
    return counts


def _write_tables(tmp: Path, tables: dict[str, pa.Table], interaction_files: set[str]) -> None:
    """Every table to its relative path under ``tmp``, with the fixed writer settings."""
    for rel in tables:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    # Arrow encodes a file on one thread: the largest file, when large, is written on a second one
    largest = max(tables, key=lambda rel: tables[rel].num_rows)
    with ThreadPoolExecutor(max_workers=1) as pool:
        background = None
        options = {rel: _INTERACTION_WRITE_OPTIONS if rel in interaction_files else _WRITE_OPTIONS for rel in tables}
        if tables[largest].num_rows >= _BACKGROUND_WRITE_ROWS:
            background = pool.submit(pq.write_table, tables[largest], tmp / largest, **options[largest])
        for rel, table in tables.items():
            if background is None or rel != largest:
                pq.write_table(table, tmp / rel, **options[rel])
        if background is not None:
            background.result()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):  # numpy scalars (np.int64 counts etc.) -> Python numbers
        return value.item()
    raise TypeError(f"meta: {type(value).__name__} is not JSON serializable")
