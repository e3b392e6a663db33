"""The side files (``items_path``, ``users_path``) -> items.parquet, users.parquet and their vocab files:
rows follow the dataset's ids (a user / item a file does not list gets missing values)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.config import InteractionsDataConfig
from data_pipelines.dataset_dir import CATEGORIES_VOCAB, ITEMS_VOCAB, USERS_VOCAB
from data_pipelines.errors import DatasetError
from data_pipelines.interactions.ids import same_type
from data_pipelines.log_columns import ids as raw_ids_of
from data_pipelines.readers import read_columns
from data_pipelines.side_columns import encode_side_columns

NO_CATEGORY = "(none)"  # the category of an item the items file lists without one


def items_table(
    cfg: InteractionsDataConfig, raw_items: pa.Array
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, int]]:
    """(items.parquet, {vocab file: table}, meta ``item_features``): vocab/items.parquet, vocab/categories.parquet
    when the items have categories, and the vocabularies of the items file's categorical columns."""
    n = len(raw_items)
    vocabs = {ITEMS_VOCAB: pd.DataFrame({"raw_id": raw_items.to_pandas(), "item_id": np.arange(n, dtype=np.int64)})}
    items = pd.DataFrame({"item_id": np.arange(n, dtype=np.int64)})
    if not cfg.items_path:
        if cfg.categories_column:
            raise DatasetError("data.interactions.categories_column is set but data.interactions.items_path is not")
        _no_side_file(cfg.items_columns, "items")
        items["categories"] = [np.zeros(0, dtype=np.int64)] * n
        return items, vocabs, {}
    side = _side_file(cfg.items_path, cfg, cfg.items_id_column, raw_items, "items")
    if cfg.categories_column:
        _check_categories_column(cfg, side)
        items["categories"], vocabs[CATEGORIES_VOCAB] = _categories(cfg, side[cfg.categories_column].to_pylist())
        side = side.drop_columns([cfg.categories_column])
    else:
        items["categories"] = [np.zeros(0, dtype=np.int64)] * n
    encoded = encode_side_columns(side, cfg.items_columns, path=cfg.items_path, what="items")
    for column, values in encoded.columns.items():
        items[column] = values
    return items, vocabs | encoded.vocabs, encoded.sizes


def _check_categories_column(cfg: InteractionsDataConfig, side: pa.Table) -> None:
    if cfg.categories_column not in side.column_names:
        raise DatasetError(
            f"{cfg.items_path}: no column {cfg.categories_column!r} (data.interactions.categories_column); "
            f"columns are {[cfg.items_id_column, *side.column_names]}"
        )
    if cfg.categories_column in cfg.items_columns:
        raise DatasetError(
            f"{cfg.items_path}: column {cfg.categories_column!r} is data.interactions.categories_column (the "
            f"category feature); drop it from data.interactions.items_columns"
        )


def _categories(cfg: InteractionsDataConfig, values: list) -> tuple[list[np.ndarray], pd.DataFrame]:
    """Each item's category ids (``NO_CATEGORY``'s when it has none) and vocab/categories.parquet."""
    names_per_item = [
        sorted({g.strip() for g in str(v).split(cfg.categories_separator) if g.strip()}) if isinstance(v, str) else []
        for v in values
    ]
    names = sorted(
        {g for gs in names_per_item for g in gs} | ({NO_CATEGORY} if any(not gs for gs in names_per_item) else set())
    )
    index = {g: c for c, g in enumerate(names)}
    per_item = [np.array(sorted(index[g] for g in gs) or [index[NO_CATEGORY]], dtype=np.int64) for gs in names_per_item]
    return per_item, pd.DataFrame({"category_id": np.arange(len(names), dtype=np.int64), "name": names})


def _no_side_file(declared: dict, what: str) -> None:
    if declared:
        raise DatasetError(
            f"data.interactions.{what}_columns declares {sorted(declared)} but data.interactions.{what}_path is not set"
        )


def _side_file(path: str, cfg: InteractionsDataConfig, id_column: str, raw_ids: pa.Array, what: str) -> pa.Table:
    """The side file's rows for ``raw_ids`` (in that order; absent ids give null rows), id column dropped."""
    p = Path(path)
    fmt = "auto" if cfg.format == "adjacency" else cfg.format  # the log's format says nothing of a side file's
    table = read_columns(p, None, fmt=fmt, delimiter=cfg.delimiter, header=True, text_columns=[id_column])
    if id_column not in table.column_names:
        raise DatasetError(
            f"{p}: no column {id_column!r} (data.interactions.{what}_id_column); columns are {table.column_names}"
        )
    if id_column in getattr(cfg, f"{what}_columns"):
        raise DatasetError(
            f"{p}: column {id_column!r} is the {what} id column (data.interactions.{what}_id_column); "
            f"drop it from data.interactions.{what}_columns"
        )
    ids = raw_ids_of(table[id_column], str(p), id_column, id_type=cfg.id_type)  # the log's rule, stripped too
    ids, keys = same_type(ids, pa.chunked_array([raw_ids]))
    duplicated = pd.Series(ids.to_numpy(zero_copy_only=False)).duplicated()
    if duplicated.any():
        raise DatasetError(f"{p}: {what} id {ids[int(np.argmax(duplicated.to_numpy()))].as_py()!r} appears twice")
    position = pc.index_in(keys, value_set=pa.concat_arrays(ids.chunks) if ids.num_chunks else pa.array([], ids.type))
    return table.drop_columns([id_column]).take(position)  # a null position (an id the file lacks): a null row


def users_table(
    cfg: InteractionsDataConfig, raw_users: pa.Array
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, int]]:
    """(users.parquet, {vocab file: table}, meta ``user_features``)."""
    n = len(raw_users)
    vocabs = {USERS_VOCAB: pd.DataFrame({"raw_id": raw_users.to_pandas(), "user_id": np.arange(n, dtype=np.int64)})}
    users = pd.DataFrame({"user_id": np.arange(n, dtype=np.int64)})
    if not cfg.users_path:
        _no_side_file(cfg.users_columns, "users")
        return users, vocabs, {}
    side = _side_file(cfg.users_path, cfg, cfg.users_id_column, raw_users, "users")
    encoded = encode_side_columns(side, cfg.users_columns, path=cfg.users_path, what="users")
    for column, values in encoded.columns.items():
        users[column] = values
    return users, vocabs | encoded.vocabs, encoded.sizes
