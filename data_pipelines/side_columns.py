"""A side file's categorical columns -> contiguous ids (``data=interactions``), what ``model.features`` reads.

Which columns (``data.interactions.items_columns`` / ``users_columns``: column -> ``SideColumnConfig``):

- undeclared: string, dictionary and boolean columns (and parquet lists of them) are categorical,
  except ``title``, kept as text (reports and the serving bundle show it as the item's name);
  integers, floats and times stay as the file has them (integers already are ids; the rest cannot
  feed a tower);
- declared ``{}``: categorical whatever its type (an integer code such as a zip code);
  ``{categorical: false}``: kept as the file has it; ``{separator: "|"}``: a string holding several
  values ("red|sale") becomes a list<int64> column, one bag per row.

Mapping, the same for every column, over the dataset's rows only (the users / items left after the
filters, so a table has no row no one uses)::

    values   strings stripped of surrounding spaces; null, "" and NaN are missing, and so is the value
             of a user / item the side file does not list
    ids      the distinct values in ascending order (strings by code point, numbers by value) -> 0..n-1
    missing  one value per row: one more id, n, only when some row is missing (vocab value null);
             several per row: an empty list (an empty bag: the table contributes zeros)
    bags     a row's ids ascending, each once

Written: the column, as int64 (one per row) or list<int64>, in place in items.parquet /
users.parquet; ``vocab/item_features/<column>.parquet`` / ``vocab/user_features/<column>.parquet``
(``id`` int64, ``value``: the raw value, null for the missing id); meta.json ``item_features`` /
``user_features`` ``{column: number of ids}`` (a feature's table rows, recsys/data/side_features.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.config import SideColumnConfig
from data_pipelines.dataset_dir import VOCAB_DIR
from data_pipelines.errors import DatasetError

__all__ = ["SIZES_IN_META", "EncodedColumns", "encode_side_columns", "vocab_file"]

SIZES_IN_META = {"items": "item_features", "users": "user_features"}  # meta.json: {column: number of ids}
RESERVED = {"items": ("item_id", "categories"), "users": ("user_id",)}  # built-in columns of items / users.parquet
TEXT_COLUMNS = ("title",)  # undeclared string columns kept as text: the item's name wherever recsys shows one


def vocab_file(what: str, column: str) -> str:
    """The vocabulary of ``column`` of the ``what`` ("items" | "users") side file, relative to the dataset dir."""
    return f"{VOCAB_DIR}/{SIZES_IN_META[what]}/{column}.parquet"


@dataclass
class EncodedColumns:
    """A side file's columns as the dataset dir holds them."""

    # column -> values per row: ids (numpy int64), bags (a list of int64 arrays), kept (pandas, Arrow-typed)
    columns: dict[str, object] = field(default_factory=dict)
    vocabs: dict[str, pd.DataFrame] = field(default_factory=dict)  # vocab file -> (id, value)
    sizes: dict[str, int] = field(default_factory=dict)  # categorical column -> number of ids


def _value_type(t: pa.DataType) -> tuple[pa.DataType, bool, bool]:
    """(the type of one value, whether a row holds a list of them, whether they are dictionary-encoded)."""
    multi = pa.types.is_list(t) or pa.types.is_large_list(t)
    if multi:
        t = t.value_type
    dictionary = pa.types.is_dictionary(t)
    return (t.value_type if dictionary else t), multi, dictionary


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_categorical(column: str, t: pa.DataType, declared: SideColumnConfig | None) -> bool:
    if declared is not None:
        return declared.categorical
    value, _, dictionary = _value_type(t)
    return (dictionary or _is_text(value) or pa.types.is_boolean(value)) and column not in TEXT_COLUMNS


def _values(flat: pa.Array) -> pa.Array:
    """``flat`` decoded, strings stripped, and null where missing (null, "", NaN)."""
    if pa.types.is_dictionary(flat.type):
        flat = flat.dictionary_decode()
    if _is_text(flat.type):
        flat = pc.utf8_trim_whitespace(flat)
        return pc.if_else(pc.equal(flat, ""), pa.scalar(None, flat.type), flat)
    if pa.types.is_floating(flat.type):
        return pc.if_else(pc.is_nan(flat), pa.scalar(None, flat.type), flat)
    return flat


def _sorted_distinct(values: pa.Array, where: str) -> pa.Array:
    try:
        distinct = pc.unique(values.drop_null())
        return distinct.take(pc.array_sort_indices(distinct))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
        raise DatasetError(f"{where}: values of type {values.type} cannot be ordered as categories ({e})") from None


def _vocab(vocab: pa.Array, missing: bool) -> pd.DataFrame:
    values = vocab.to_pylist() + ([None] if missing else [])
    return pd.DataFrame({"id": np.arange(len(values), dtype=np.int64), "value": pd.Series(values, dtype=object)})


def _one_per_row(column: pa.Array, where: str) -> tuple[np.ndarray, pa.Array, bool]:
    """(ids per row, the vocabulary, whether a missing id follows it)."""
    values = _values(column)
    vocab = _sorted_distinct(values, where)
    index = pc.index_in(values, value_set=vocab)
    missing = index.null_count > 0
    return pc.fill_null(index, len(vocab)).to_numpy().astype(np.int64), vocab, missing


def _bags(lists: pa.Array, num_rows: int, where: str) -> tuple[list[np.ndarray], pa.Array]:
    """(ids per row, each row's ascending and once, the vocabulary) of a list column."""
    row = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
    values = _values(pc.list_flatten(lists))
    present = values.is_valid()
    vocab = _sorted_distinct(values, where)
    ids = pc.index_in(values.filter(present), value_set=vocab).to_numpy().astype(np.int64)
    row = row[present.to_numpy(zero_copy_only=False)]
    pairs = np.unique(row * max(len(vocab), 1) + ids)  # sorted by row, then id; duplicates once
    rows, ids = np.divmod(pairs, max(len(vocab), 1))
    indptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=num_rows))]
    return [ids[indptr[r] : indptr[r + 1]] for r in range(num_rows)], vocab


def encode_side_columns(
    table: pa.Table, declared: Mapping[str, SideColumnConfig], *, path: str, what: str
) -> EncodedColumns:
    """``table`` (one row per user / item of the dataset, in id order; its id column dropped) as the dataset
    dir holds it: categorical columns as ids, the others as they are; ``what`` is "items" or "users"."""
    setting = f"data.interactions.{what}_columns"
    taken = [c for c in table.column_names if c in RESERVED[what]]
    if taken:
        raise DatasetError(
            f"{path}: column {taken[0]!r} has the name of a column the dataset dir's {what}.parquet holds "
            f"already ({', '.join(RESERVED[what])}); rename it"
        )
    unknown = [c for c in declared if c not in table.column_names]
    if unknown:
        raise DatasetError(
            f"{path}: no column {unknown[0]!r} ({setting}.{unknown[0]}); columns are {table.column_names}"
        )
    out = EncodedColumns()
    for column in table.column_names:
        spec = declared.get(column)
        values = table[column].combine_chunks()
        where = f"{path}: column {column!r}"
        if not _is_categorical(column, values.type, spec):
            if spec is not None and spec.separator:
                raise DatasetError(f"{where}: {setting}.{column} has a separator but categorical: false")
            out.columns[column] = values.to_pandas(types_mapper=pd.ArrowDtype)  # its Arrow type, nulls kept
            continue
        if "/" in column or "\\" in column or column.startswith("."):
            raise DatasetError(f"{where}: a categorical column's name must not hold '/' or start with '.' (vocab file)")
        value, multi, _ = _value_type(values.type)
        separator = spec.separator if spec is not None else ""
        if separator:
            if multi or not _is_text(value):
                raise DatasetError(
                    f"{where} is {values.type}: {setting}.{column}.separator={separator!r} splits strings only"
                )
            if pa.types.is_dictionary(values.type):
                values = values.dictionary_decode()
            values = pc.split_pattern(values, pattern=separator)
            multi = True
        if multi:
            out.columns[column], vocab = _bags(values, len(table), where)
            missing = False
        else:
            out.columns[column], vocab, missing = _one_per_row(values, where)
        out.vocabs[vocab_file(what, column)] = _vocab(vocab, missing)
        out.sizes[column] = len(vocab) + int(missing)
    return out
