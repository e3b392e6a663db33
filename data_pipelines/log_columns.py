"""One log's raw columns -> the canonical ones: ``user``, ``item`` (raw ids: int64 or string),
``timestamp`` (int64, epoch time in one unit for the whole dataset, or the row's position in the
file) and ``rating`` (float32).

Works on whole tables or on record batches alike: ``first_row`` is the 0-based position of the
batch's first row in the file, so every error names the file, the 1-based row and the field.

Ids are identities (``data.interactions.id_type``)::

    every id field    surrounding whitespace stripped (" i5" is "i5"; side files' id columns too);
                      empty after that, or null: an error naming the row
    auto (default)    a text id is read as an integer only when it is written as one ("7", "-3":
                      no leading zero, no "+"); otherwise it stays its text, so "007" and "7" are
                      two ids. Integer-typed columns (parquet) stay integers; beyond int64
                      (uint64 above 2^63) they become their decimal text
    string            every id is its text (an integer column's values: their decimal text)
    int               every id must be an integer ("007" is 7); one that is not, or does not fit
                      int64, is an error naming the row

A batch may come out int64 and a later one strings: an integer written canonically and its text
are the same id, so the vocabulary (``vocab.VocabBuilder``) turns the integers it holds into text
without merging or splitting any id.

Timestamps (``TimeUnits``): numbers keep their unit, told by their size (``data.interactions.
timestamp_unit=auto``: |t| < 1e11 seconds, < 1e14 milliseconds, < 1e17 microseconds, else
nanoseconds) or declared; one unit for every file of the dataset (a column mixing them is
refused, naming a row of each); ISO-8601 strings and typed times become that unit too (seconds
when it is auto). meta.json ``timestamps`` names the unit. ISO-8601 strings with a UTC offset ("Z",
"+02:00") are read at it, those without as UTC; a dataset mixing the two (in one column, or across
its chunks and files) is refused, naming a row of each: which zone a naive time meant is not known.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.errors import DatasetError

__all__ = ["LOG_SCHEMA_NAMES", "TimeUnits", "convert_log", "ids", "refuse_nulls"]

LOG_SCHEMA_NAMES = ("user", "item", "timestamp", "rating")
Column = pa.Array | pa.ChunkedArray

_CANONICAL_INT = r"^(0|-?[1-9][0-9]*)$"  # what str(int) prints: the text and the number are one id
_INTEGER = r"^[+-]?[0-9]+$"
_INT64_MAX = 2**63 - 1


def refuse_nulls(column: Column, label: str, field: str, first_row: int = 0) -> None:
    if column.null_count:
        row = int(pc.index(pc.is_null(column), True).as_py())
        raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is empty")


def _first(mask: Column) -> int:
    """0-based position of the first true value of a boolean column."""
    return int(pc.index(mask, True).as_py())


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _integer_ids(column: Column, label: str, field: str, first_row: int, id_type: str) -> Column:
    """An integer-typed id column: int64, or its decimal text (``string``; uint64 beyond int64 in ``auto``)."""
    if id_type == "string":
        return pc.cast(column, pa.string())
    if pa.types.is_uint64(column.type) and len(column) and pc.max(column).as_py() > _INT64_MAX:
        if id_type == "int":
            row = _first(pc.greater(column, pa.scalar(_INT64_MAX, pa.uint64())))
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {column[row].as_py()} does not fit int64 "
                "(data.interactions.id_type=int); set data.interactions.id_type=auto or string to keep it as its text"
            )
        return pc.cast(column, pa.string())
    return pc.cast(column, pa.int64())


def _text_ids(column: Column, label: str, field: str, first_row: int, id_type: str) -> Column:
    """A text id column, stripped: int64 where ``id_type`` says so, else strings."""
    text = pc.cast(pc.utf8_trim_whitespace(column), pa.string())
    empty = pc.equal(pc.utf8_length(text), 0)
    if pc.any(empty).as_py():
        raise DatasetError(f"{label}: row {first_row + _first(empty) + 1}: field {field!r} is empty")
    if id_type == "string":
        return text
    if id_type == "int":
        not_int = pc.invert(pc.match_substring_regex(text, _INTEGER))
        if pc.any(not_int).as_py():
            row = _first(not_int)
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {text[row].as_py()!r} is not an integer "
                "(data.interactions.id_type=int); set data.interactions.id_type=auto or string to keep ids as text"
            )
        try:
            return pc.cast(pc.replace_substring_regex(text, r"^\+", ""), pa.int64())
        except pa.ArrowInvalid:
            row = next(j for j, v in enumerate(text.to_pylist()) if not -(2**63) <= int(v) <= _INT64_MAX)
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {text[row].as_py()!r} does not fit int64 "
                "(data.interactions.id_type=int); set data.interactions.id_type=auto or string to keep it as its text"
            ) from None
    if pc.all(pc.match_substring_regex(text, _CANONICAL_INT)).as_py():
        try:
            return pc.cast(text, pa.int64())
        except pa.ArrowInvalid:  # beyond int64 (a uint64 id): the text
            return text
    return text


def ids(column: Column, label: str, field: str, first_row: int = 0, id_type: str = "auto") -> Column:
    """Raw ids as int64 or strings by the rules of the module docstring; nulls, empty and decimals refused."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode() if isinstance(column, pa.Array) else pc.cast(column, column.type.value_type)
    refuse_nulls(column, label, field, first_row)
    kind = column.type
    if pa.types.is_floating(kind):
        raise DatasetError(
            f"{label}: field {field!r} holds decimals ({kind}); ids must be integers or strings (store the column "
            "as integers or as text)"
        )
    if pa.types.is_integer(kind):
        return _integer_ids(column, label, field, first_row, str(id_type))
    if _is_text(kind):
        return _text_ids(column, label, field, first_row, str(id_type))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        raise DatasetError(f"{label}: field {field!r} has type {kind}; ids must be integers or strings")
    return _text_ids(pc.cast(column, pa.string()), label, field, first_row, str(id_type))


# ---------------------------------------------------------------- timestamps

UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_UNITS = ("s", "ms", "us", "ns")
# an ISO-8601 time of day followed by a UTC offset ("T10:00:00Z", " 10:00+02:00", "T1000-0530"); a date alone has none
_WITH_OFFSET = r"[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"
_UNIT_BOUNDS = np.array([1e11, 1e14, 1e17])  # |t| below each: s, ms, us (1e11 s and 1e14 ms are the year 5138)
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


class TimeUnits:
    """The one unit of a dataset's numeric timestamps, over every batch and file it reads.

    ``declared`` is ``data.interactions.timestamp_unit``: "auto" tells the unit from the numbers'
    size (the first batch fixes it; a later value of another size is an error naming both rows);
    "s" | "ms" | "us" | "ns" takes every number as that unit. Typed times (ISO-8601 strings,
    parquet timestamps) are converted to the unit (seconds when nothing fixed it).
    """

    def __init__(self, declared: str = "auto") -> None:
        self.declared = str(declared)
        self.unit = None if self.declared == "auto" else self.declared
        self._where: tuple[str, str] | None = None  # (file, row) that fixed the unit, for a later one's error
        # the first ISO-8601 time read with a UTC offset and the first without: (file, "row N = 'text'")
        self._zones: dict[bool, tuple[str, str]] = {}

    @property
    def name(self) -> str:
        """meta.json's ``timestamps``: "seconds", "milliseconds", ... (seconds when no time was read)."""
        return UNIT_NAMES[self.unit or "s"]

    def _fix(self, unit: str, label: str, where: str, field: str) -> None:
        """``unit`` is the one of ``where`` (a row of ``label``): the dataset's, or an error naming both rows."""
        if self.unit is None:
            self.unit, self._where = unit, (label, where)
            return
        if unit == self.unit:
            return
        fixed_label, fixed_where = self._where or (label, "")
        fixed = f"{fixed_where} reads as epoch {UNIT_NAMES[self.unit]}" if fixed_where else f"the unit is {self.unit}"
        if fixed_label != label:
            fixed = f"{fixed_label}: {fixed}"
        raise DatasetError(
            f"{label}: field {field!r} mixes time units: {where} reads as epoch {UNIT_NAMES[unit]}, but {fixed} "
            "(data.interactions.timestamp_unit=auto tells the unit by size: < 1e11 seconds, < 1e14 milliseconds, "
            "< 1e17 microseconds, else nanoseconds). Convert the column to one unit; if every value already is in "
            "one, set data.interactions.timestamp_unit=s|ms|us|ns"
        )

    def numbers(self, values: np.ndarray, label: str, field: str, first_row: int) -> None:
        """Check (auto: tell) the unit of a batch of numeric timestamps."""
        if self.declared != "auto" or not len(values):
            return
        size = np.abs(values.astype(np.float64, copy=False))
        lo, hi = np.searchsorted(_UNIT_BOUNDS, [size.min(), size.max()], side="right")
        first = int(np.searchsorted(_UNIT_BOUNDS, size[0], side="right"))
        self._fix(_UNITS[first], label, f"row {first_row + 1} = {_show(values[0])}", field)
        if lo != hi:  # the size class is monotone in |t|: one class unless min and max differ
            classes = np.searchsorted(_UNIT_BOUNDS, size, side="right")
            row = int(np.argmax(classes != first))
            self._fix(_UNITS[int(classes[row])], label, f"row {first_row + row + 1} = {_show(values[row])}", field)

    def zones(self, text: pd.Series, label: str, field: str, first_row: int) -> None:
        """ISO-8601 strings all with a UTC offset or all without, over the dataset, or an error naming a row of each."""
        with_offset = text.str.strip().str.contains(_WITH_OFFSET, regex=True).to_numpy(dtype=bool)
        self._zoned(with_offset, lambda row: repr(text.iloc[row]), label, field, first_row)

    def typed_zone(self, column: Column, label: str, field: str, first_row: int) -> None:
        """A typed time column (a CSV reader's inferred ISO times, parquet): zoned or naive, as the strings are."""
        zoned = getattr(column.type, "tz", None) is not None
        self._zoned(np.full(len(column), zoned), lambda row: repr(str(column[row].as_py())), label, field, first_row)

    def _zoned(self, with_offset: np.ndarray, shown, label: str, field: str, first_row: int) -> None:
        for kind in (True, False):
            if kind not in self._zones and (with_offset == kind).any():
                row = int(np.argmax(with_offset == kind))
                self._zones[kind] = (label, f"row {first_row + row + 1} = {shown(row)}")
        if len(self._zones) < 2:
            return
        (naive_label, naive), (offset_label, offset) = self._zones[False], self._zones[True]
        where = label if label in (naive_label, offset_label) else naive_label
        naive_at = naive if naive_label == where else f"{naive_label}: {naive}"
        offset_at = offset if offset_label == where else f"{offset_label}: {offset}"
        raise DatasetError(
            f"{where}: field {field!r} mixes times with and without a UTC offset: {naive_at} has none, "
            f"{offset_at} has one; a time without one would be read as UTC, which it may not be. Give every time "
            "its offset (or none, and every time is read as UTC)"
        )

    def typed(self, label: str, field: str, first_row: int) -> str:
        """The unit typed times of ``label`` become (and a check that they may)."""
        unit = self.unit or "s"
        self._fix(unit, label, f"row {first_row + 1} (a typed time, {UNIT_NAMES[unit]})", field)
        return unit


def _in_unit(values: np.ndarray, unit: str, target: str) -> np.ndarray:
    """Epoch integers in ``unit`` as ``target`` units (floored when ``target`` is coarser)."""
    if _NS_PER[unit] >= _NS_PER[target]:
        return values * (_NS_PER[unit] // _NS_PER[target])
    return np.floor_divide(values, _NS_PER[target] // _NS_PER[unit])


def _show(value) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _timestamps(column: Column | None, n: int, label: str, field: str, first_row: int, units: TimeUnits) -> np.ndarray:
    """Epoch times (int64, in ``units``' unit) from integers, floats, Arrow timestamps or ISO-8601
    strings; the row position in the file when there is no column."""
    if column is None:
        return np.arange(first_row, first_row + n, dtype=np.int64)
    refuse_nulls(column, label, field, first_row)
    kind = column.type
    if pa.types.is_integer(kind):
        values = np.asarray(column.to_numpy()).astype(np.int64, copy=False)
        units.numbers(values, label, field, first_row)
        return values
    if pa.types.is_floating(kind):
        values = np.asarray(column.to_numpy())
        if not np.isfinite(values).all():
            row = int(np.argmax(~np.isfinite(values)))
            raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is {values[row]}, not a time")
        units.numbers(values, label, field, first_row)
        return np.floor(values).astype(np.int64)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        units.typed_zone(column, label, field, first_row)
        ns = pc.cast(pc.cast(column, pa.timestamp("ns")), pa.int64()).to_numpy()
        return _in_unit(np.asarray(ns), "ns", units.typed(label, field, first_row))
    if _is_text(kind):
        text = column.to_pandas()
        units.zones(text, label, field, first_row)
        parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        if parsed.isna().any():
            row = int(np.argmax(parsed.isna().to_numpy()))
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {text.iloc[row]!r} is neither epoch "
                "seconds nor an ISO-8601 time"
            )
        wall = parsed.dt.tz_localize(None)  # UTC; pandas picks the resolution (3.x: microseconds), not always ns
        resolution = np.datetime_data(wall.dtype)[0]
        return _in_unit(wall.to_numpy().astype(np.int64), resolution, units.typed(label, field, first_row))
    raise DatasetError(f"{label}: field {field!r} has type {kind}, not a time")


def _ratings(column: Column | None, n: int, label: str, field: str, first_row: int) -> np.ndarray:
    if column is None:
        return np.ones(n, dtype=np.float32)
    if _is_text(column.type):  # numbers written as text, or a value that is not one ("5 stars")
        text = column.to_pandas().str.strip()
        numbers = pd.to_numeric(text, errors="coerce")
        bad = (numbers.isna() & text.notna() & (text != "")).to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise DatasetError(
                f"{label}: row {first_row + row + 1}: field {field!r} = {text.iloc[row]!r} is not a number"
            )
        column = pa.array(numbers.to_numpy(np.float64))
    elif not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise DatasetError(f"{label}: field {field!r} has type {column.type}, expected numbers")
    values = np.asarray(column.to_numpy(zero_copy_only=False)).astype(np.float32)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise DatasetError(f"{label}: row {first_row + row + 1}: field {field!r} is empty or not finite")
    return values


def convert_log(
    batch: pa.RecordBatch | pa.Table,
    fields: dict[str, str],
    label: str,
    *,
    first_row: int = 0,
    time_offset: int = 0,
    id_type: str = "auto",
    units: TimeUnits | None = None,
) -> pa.RecordBatch | pa.Table:
    """``batch``'s columns named by ``fields`` (canonical name -> source name; timestamp and rating
    optional) as the canonical columns. ``time_offset`` is added to file positions (no timestamp
    column), so the rows of several files keep one order; ``units`` carries the time unit from
    one batch and file to the next (a fresh one: this batch alone)."""
    n = batch.num_rows
    ts_field, rating_field = fields.get("timestamp", ""), fields.get("rating", "")
    units = units if units is not None else TimeUnits()
    timestamps = _timestamps(batch[ts_field] if ts_field else None, n, label, ts_field, first_row, units)
    if not ts_field:
        timestamps = timestamps + time_offset
    ratings = _ratings(batch[rating_field] if rating_field else None, n, label, rating_field, first_row)
    columns = [
        ids(batch[fields["user"]], label, fields["user"], first_row, id_type),
        ids(batch[fields["item"]], label, fields["item"], first_row, id_type),
        pa.array(timestamps),
        pa.array(ratings),
    ]
    if isinstance(batch, pa.Table):
        return pa.table(dict(zip(LOG_SCHEMA_NAMES, columns)))
    return pa.RecordBatch.from_arrays(columns, names=list(LOG_SCHEMA_NAMES))
