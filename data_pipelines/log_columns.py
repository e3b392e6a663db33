"""One log's raw columns -> the canonical ones: ``user``, ``item`` (raw ids: int64 or string),
``timestamp`` (int64 epoch seconds, or the row's position in the file) and ``rating`` (float32).

Works on whole tables or on record batches alike: ``first_row`` is the 0-based position of the
batch's first row in the file, so every error names the file, the 1-based row and the field.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.errors import DatasetError

__all__ = ["LOG_SCHEMA_NAMES", "convert_log", "ids", "refuse_nulls"]

LOG_SCHEMA_NAMES = ("user", "item", "timestamp", "rating")
Column = pa.Array | pa.ChunkedArray


def refuse_nulls(column: Column, label: str, field: str, first_row: int = 0) -> None:
    if column.null_count:
        row = int(pc.index(pc.is_null(column), True).as_py())
        raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is empty")


def _timestamps(column: Column | None, n: int, label: str, field: str, first_row: int) -> np.ndarray:
    """Epoch seconds (int64) from integers, floats, Arrow timestamps or ISO-8601 strings; the row
    position in the file when there is no column."""
    if column is None:
        return np.arange(first_row, first_row + n, dtype=np.int64)
    refuse_nulls(column, label, field, first_row)
    kind = column.type
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy()).astype(np.int64, copy=False)
    if pa.types.is_floating(kind):
        values = np.asarray(column.to_numpy())
        if not np.isfinite(values).all():
            row = int(np.argmax(~np.isfinite(values)))
            raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is {values[row]}, not a time")
        return np.floor(values).astype(np.int64)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return np.asarray(pc.cast(pc.cast(column, pa.timestamp("s")), pa.int64()).to_numpy())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column.to_pandas()
        parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        if parsed.isna().any():
            row = int(np.argmax(parsed.isna().to_numpy()))
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {text.iloc[row]!r} is neither epoch "
                "seconds nor an ISO-8601 time"
            )
        return (parsed.astype("int64") // 1_000_000_000).to_numpy(np.int64)  # ns -> s
    raise DatasetError(f"{label}: field {field!r} has type {kind}, not a time")


def _ratings(column: Column | None, n: int, label: str, field: str, first_row: int) -> np.ndarray:
    if column is None:
        return np.ones(n, dtype=np.float32)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise DatasetError(f"{label}: field {field!r} has type {column.type}, expected numbers")
    values = np.asarray(column.to_numpy(zero_copy_only=False)).astype(np.float32)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is empty or not finite")
    return values


def ids(column: Column, label: str, field: str, first_row: int = 0) -> Column:
    """Raw ids as int64 (integers of any range) or strings; nulls and decimals refused."""
    refuse_nulls(column, label, field, first_row)
    if pa.types.is_floating(column.type):
        raise DatasetError(f"{label}: field {field!r} holds decimals; ids must be integers or strings")
    if pa.types.is_integer(column.type):
        return pc.cast(column, pa.int64())
    return pc.cast(column, pa.string())


def convert_log(
    batch: pa.RecordBatch | pa.Table, fields: dict[str, str], label: str, *, first_row: int = 0, time_offset: int = 0
) -> pa.RecordBatch | pa.Table:
    """``batch``'s columns named by ``fields`` (canonical name -> source name; timestamp and rating
    optional) as the canonical columns. ``time_offset`` is added to file positions (no timestamp
    column), so the rows of several files keep one order."""
    n = batch.num_rows
    ts_field, rating_field = fields.get("timestamp", ""), fields.get("rating", "")
    timestamps = _timestamps(batch[ts_field] if ts_field else None, n, label, ts_field, first_row)
    if not ts_field:
        timestamps = timestamps + time_offset
    ratings = _ratings(batch[rating_field] if rating_field else None, n, label, rating_field, first_row)
    columns = [
        ids(batch[fields["user"]], label, fields["user"], first_row),
        ids(batch[fields["item"]], label, fields["item"], first_row),
        pa.array(timestamps),
        pa.array(ratings),
    ]
    if isinstance(batch, pa.Table):
        return pa.table(dict(zip(LOG_SCHEMA_NAMES, columns)))
    return pa.RecordBatch.from_arrays(columns, names=list(LOG_SCHEMA_NAMES))
