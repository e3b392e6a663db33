"""Side features (``model.features``): categorical columns of users.parquet / items.parquet as table ids.

A feature reads one column into a CSR over its file's rows (users or items): ``ids[indptr[r]:indptr[r + 1]]``
are row r's ids, one for an int64 column, a bag for a list<int64> one. Each feature looks up a table
(its own, or one it shares with another feature on the other tower) that is one more KJT key after the
built-in ones (recsys/data/features.py), stride B_q + C like theirs; its layout entry (recsys/data/layout.py)
says which, and recsys/data/row_sources.py fills its rows::

    source  tower      rows [0, B_q): query                          rows [B_q, R): candidate
    users   query      the user's ids                                 empty
    items   query      the ids of all the query's history items       empty
    items   candidate  empty                                          the candidate item's ids

Two features share a table when one feeds the query tower and the other the candidate tower (history
years and the candidate's year): one key per table keeps fbgemm's fast single-feature CPU path
(recsys/data/features.py), so a table has at most one feature per tower.

Ids are contiguous by the dataset dir's contract (data_pipelines maps raw values when it prepares;
``data=interactions`` maps the side files' categorical columns, data_pipelines/side_columns.py).
A table has as many rows as meta.json's ``user_features`` / ``item_features`` declare for the column
(a value no row holds still gets its row), else the column's largest id + 1. Every id is checked here
once, naming file, column and value, and again in every batch before the lookup (fbgemm's CPU kernel
would silently train row 0 for an out-of-range id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.dataset_dir import ITEMS_FILE, USERS_FILE
from recsys.data.dataset import RetrievalData
from recsys.data.features import TABLES

if TYPE_CHECKING:  # recsys.config imports evaluation code; the data layer needs only the fields
    from recsys.config import FeatureConfig

SOURCE_FILES = {"users": USERS_FILE, "items": ITEMS_FILE}
SIZES_IN_META = {"users": "user_features", "items": "item_features"}  # meta.json: {column: number of ids}
ID_COLUMNS = {"users": "user_id", "items": "item_id"}


@dataclass(frozen=True)
class SideFeature:
    """One configured feature with its column's ids, ready to fill its KJT key."""

    name: str  # the model.features key
    table: str  # the table it looks up = its KJT key
    source: str  # "users" | "items"
    column: str
    tower: str  # "query" | "candidate"
    indptr: np.ndarray  # int64 [rows of the source file + 1]
    ids: np.ndarray  # int64: row r's ids are ids[indptr[r]:indptr[r + 1]]
    num_ids: int  # rows its table needs for this column

    @property
    def label(self) -> str:
        """How errors name it: the feature, its file and column."""
        return f"{self.name} ({SOURCE_FILES[self.source]} column '{self.column}')"


def read_column(
    root: Path, meta: Mapping, source: str, column: str, num_rows: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """(indptr, ids, num_ids) of ``column`` of the ``source`` file of the dataset dir at ``root``."""
    path = root / SOURCE_FILES[source]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; prepare the dataset again (python -m data_pipelines.prepare)")
    names = pq.ParquetFile(path).schema_arrow.names
    if column not in names:
        raise ValueError(f"{path}: no column '{column}' (columns: {names})")
    table = pq.read_table(path, columns=[ID_COLUMNS[source], column])
    row_ids = table.column(0).to_numpy()
    if not np.array_equal(row_ids, np.arange(num_rows)):
        raise ValueError(f"{path}: column '{ID_COLUMNS[source]}' must list 0..{num_rows - 1} in order")
    values = table.column(1).combine_chunks()
    is_list = pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
    if not pa.types.is_integer(values.type.value_type if is_list else values.type):
        raise ValueError(
            f"{path}: column '{column}' is {values.type}, not integer ids (int64, or list<int64> for several per "
            "row); map its raw values to contiguous ids 0.. when preparing the dataset (data_pipelines; "
            f"data=interactions maps strings, and a column declared in data.interactions.{source}_columns)"
        )
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"{path}: column '{column}' is null in row {row}; a feature column needs ids in every row "
            "(give missing values an id of their own when preparing the dataset; data=interactions does for the "
            f"columns it maps: declare it in data.interactions.{source}_columns)"
        )
    if is_list:
        offsets = values.offsets.to_numpy().astype(np.int64)
        indptr, flat = offsets - offsets[0], values.flatten()
        if flat.null_count:
            raise ValueError(f"{path}: column '{column}' is {values.type}: lists of ids must hold no nulls")
    else:
        indptr, flat = np.arange(num_rows + 1, dtype=np.int64), values
    ids = flat.to_numpy().astype(np.int64, copy=False)
    declared = meta.get(SIZES_IN_META[source], {}).get(column)
    num_ids = int(declared) if declared is not None else (int(ids.max()) + 1 if ids.size else 1)
    if ids.size and (ids.min() < 0 or ids.max() >= num_ids):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        where = (
            f"meta.json {SIZES_IN_META[source]}.{column} = {num_ids}" if declared is not None else "ids must be >= 0"
        )
        raise ValueError(f"{path}: column '{column}' has id {bad} outside [0, {num_ids}) ({where})")
    return indptr, ids, num_ids


def resolve_side_features(features: Mapping[str, FeatureConfig], data: RetrievalData) -> tuple[SideFeature, ...]:
    """``model.features`` checked against the built-in tables and each other, their columns read from ``data.dir``."""
    rows = {"users": data.num_users, "items": data.num_items}
    columns: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, int]] = {}
    out = []
    for name, spec in features.items():
        key = f"model.features.{name}"
        table = spec.table or name
        if table in TABLES:
            raise ValueError(
                f"{key}.table={table!r}: a built-in table ({', '.join(TABLES)}); a side feature looks up its own "
                "table or shares one with another side feature"
            )
        owner = next((f.name for f in out if f.table == table and f.tower == spec.tower), None)
        if owner is not None:
            raise ValueError(
                f"{key}.table={table!r}: feature {owner!r} already looks it up on the {spec.tower} tower; a table "
                "takes one feature per tower (one KJT key; recsys/data/side_features.py)"
            )
        if (spec.source, spec.column) not in columns:
            try:
                columns[(spec.source, spec.column)] = read_column(
                    data.dir, data.meta, spec.source, spec.column, rows[spec.source]
                )
            except ValueError as e:
                raise ValueError(f"{key}.column={spec.column!r}: {e}") from None
        indptr, ids, num_ids = columns[(spec.source, spec.column)]
        out.append(SideFeature(name, table, spec.source, spec.column, spec.tower, indptr, ids, num_ids))
    return tuple(out)


def with_side_features(data: RetrievalData, features: Mapping[str, FeatureConfig]) -> RetrievalData:
    """``data`` carrying its configured side features (``data`` itself when there are none)."""
    if not features:
        return data
    return replace(data, side_features=resolve_side_features(features, data))
