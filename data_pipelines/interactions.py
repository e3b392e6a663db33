"""Any interaction log -> a dataset dir, by configuration alone (``data=interactions``, ``data=gowalla``).
(Over 400 lines: one source's read -> split -> side files, each step a short function; a package is next.)

    $ python -m data_pipelines.prepare data=interactions data.interactions.path=logs/clicks.csv.gz \\
          data.interactions.user_column=visitor data.interactions.item_column=sku \\
          data.interactions.timestamp_column=ts
    $ python -m data_pipelines.prepare data=gowalla        # LightGCN's given split, valid carved from train

Pipeline: read (``readers``: CSV / TSV / parquet / adjacency lists) -> raw ids (``log_columns.ids``:
int64 or strings by the identity rule) mapped to contiguous indices in ascending raw-id order -> ``filter_interactions``
(min rating, one row per (user, item): the latest, k-core) -> the protocol -> ids compacted again
if the protocol dropped any -> side files -> ``write_dataset_dir`` (atomic), cached in
``<root>/<name>-<protocol>-<key>`` by the sources' sha256 and every option.

Memory: recbole, loo and strong_generalization run through ``bucketed.split_log``, which streams
the log in record batches and holds at most about ``data.interactions.memory_budget_mb`` of rows
(past it, the log and its user buckets live in a work folder beside the dataset dir, removed
after), plus O(distinct users + items). The dataset is the same whatever the budget. ``given``
holds its files in memory (about 100 bytes a row at its peak); split a log larger than memory with
another protocol, or by user before preparing it.

Rules a user can rely on:

- **Ids are identities** (``log_columns``): stripped of surrounding whitespace, in the log and the
  side files alike; a text id is a number only when every id of the column, in every file, is a
  canonical integer (or ``id_type=int``): "007" and "7" are two ids.
- **Timestamps keep one unit** (``log_columns.TimeUnits``), told by size or ``timestamp_unit``, the
  same in every file; a mix is refused naming a row of each; meta.json ``timestamps`` names it.
- **No timestamps**: ``timestamp`` holds the row's position in the file, so "a user's latest
  items" means the last ones in the file (meta.json: ``"timestamps": "file_order"``).
- **No categories** (no items file, or no ``categories_column``): ``num_categories`` is 0 and the
  model has no category table (nothing zero-filled stands in for it).
- **Side files** (``items_path``, ``users_path``): their rows follow the dataset's ids (a user / item
  they do not list gets missing values); categorical columns become ids for ``model.features``
  (``side_columns``: which columns, the mapping, the vocab files and meta.json sizes).
- **protocol=given**: the vocabulary is the training file's (after its filters). Valid / test rows
  whose user or item never occurs in train, or whose (user, item) pair is in train, are dropped and
  counted in meta.json ``given_split.dropped``; a split left empty is an error. Without a valid
  file, ``valid_fraction`` of each user's train rows is carved out (``splits.carve_valid``): the
  test file is never used for any choice.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines import readers
from data_pipelines.bucketed import split_log
from data_pipelines.config import InteractionsDataConfig
from data_pipelines.dataset_dir import (
    CATEGORIES_VOCAB,
    CODE_VERSION,
    HELDOUT_USERS_FILE,
    ITEMS_VOCAB,
    USERS_VOCAB,
    is_prepared,
    write_dataset_dir,
)
from data_pipelines.download import file_digests
from data_pipelines.errors import DatasetError
from data_pipelines.log_columns import TimeUnits, convert_log
from data_pipelines.log_columns import ids as raw_ids_of
from data_pipelines.readers import (
    ChunkRefused,
    delimited_header,
    detect_format,
    iter_columns,
    iter_csv_chunks,
    read_adjacency,
    read_columns,
)
from data_pipelines.side_columns import encode_side_columns
from data_pipelines.splits import PROTOCOLS, carve_valid, filter_interactions

__all__ = ["PIPELINE_VERSION", "log_format", "prepare_interactions"]

# bump when this module's output for the same input changes (2: ids by the identity rule of log_columns,
# time units told and named in meta.json, raw_ids in meta.json)
PIPELINE_VERSION = "interactions/2"
NO_CATEGORY = "(none)"  # the category of an item the items file lists without one
_CHUNKED_MIN_BYTES = 1 << 26  # an uncompressed CSV this big is parsed in chunks (readers.iter_csv_chunks)
SIDE_COLUMNS_VERSION = 1  # bump when side_columns.py's output for the same side file changes
_SIDE_COLUMNS = ("items_columns", "users_columns")


# ---------------------------------------------------------------- reading one log


def _fields(cfg: InteractionsDataConfig) -> dict[str, str]:
    """Canonical column -> the log's column (timestamp and rating only when configured)."""
    fields = {"user": cfg.user_column, "item": cfg.item_column}
    if cfg.timestamp_column:
        fields["timestamp"] = cfg.timestamp_column
    if cfg.rating_column:
        fields["rating"] = cfg.rating_column
    return fields


def _id_columns(cfg: InteractionsDataConfig) -> list[str]:
    """The log's id columns: read as text, never parsed by the CSV reader (``log_columns.ids`` reads them)."""
    return list(dict.fromkeys((cfg.user_column, cfg.item_column)))


def log_format(cfg: InteractionsDataConfig, path: Path) -> str:
    """``data.interactions.format``, or with "auto" the one the name tells; a ``.txt`` file whose
    first line is a header naming the user and item columns (split at commas or tabs) is a CSV / TSV."""
    if cfg.format != "auto":
        return cfg.format
    fmt = detect_format(path)
    if fmt == "adjacency" and cfg.header:
        return delimited_header(path, _id_columns(cfg)) or fmt
    return fmt


def _adjacency_log(cfg: InteractionsDataConfig, p: Path, time_offset: int) -> pa.Table:
    if cfg.timestamp_column or cfg.rating_column:
        told = "data.interactions.format=adjacency" if cfg.format == "adjacency" else "a .txt name"
        raise DatasetError(
            f"{p}: read as adjacency lists (`user item item ...`; {told}), which hold neither timestamps nor "
            "ratings: for a CSV / TSV log set data.interactions.format=csv or tsv (with header=true its first line "
            "names the columns); for adjacency lists unset data.interactions.timestamp_column / rating_column"
        )
    t = read_adjacency(p)
    return pa.table(
        {
            "user": raw_ids_of(t["user"], str(p), "user id", id_type=cfg.id_type),
            "item": raw_ids_of(t["item"], str(p), "item id", id_type=cfg.id_type),
            "timestamp": pc.add(t["position"], time_offset),
            "rating": pa.array(np.ones(t.num_rows, dtype=np.float32)),
        }
    )


def read_log(
    cfg: InteractionsDataConfig, path: str, *, time_offset: int = 0, units: TimeUnits | None = None
) -> pa.Table:
    """One log as columns user, item (raw ids), timestamp (int64), rating (float32), in memory.

    ``time_offset`` is added to file positions when there is no timestamp column, so rows of
    several files (a given split) keep one order; ``units`` keeps one time unit over them. The files
    of a parquet folder are read one by one, each as it types its columns.
    """
    p = Path(path)
    fmt = log_format(cfg, p)
    if fmt == "adjacency":
        return _adjacency_log(cfg, p, time_offset)
    fields = _fields(cfg)
    columns = list(dict.fromkeys(fields.values()))
    units = units if units is not None else TimeUnits(cfg.timestamp_unit)
    convert = dict(id_type=cfg.id_type, units=units)
    if fmt != "parquet":
        table = read_columns(
            p, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=_id_columns(cfg)
        )
        return convert_log(table, fields, str(p), time_offset=time_offset, **convert)
    readers._columnar_log(p, fmt)  # a missing path: named
    tables, first_row = [], 0
    for file, table in readers.iter_parquet_tables(p, columns):
        offset = time_offset + first_row  # positions run on across the files
        tables.append(convert_log(table, fields, str(file), time_offset=offset, **convert))
        first_row += table.num_rows
    if first_row == 0:
        raise DatasetError(f"{p}: no rows (a header alone, or an empty file)")
    users, items = _same_type(*(t["user"] for t in tables)), _same_type(*(t["item"] for t in tables))
    tables = [t.set_column(0, "user", u).set_column(1, "item", i) for t, u, i in zip(tables, users, items)]
    return pa.concat_tables(tables)


def _csv_fits(path: Path, budget_bytes: int) -> bool:
    """Whether a CSV / TSV file parses within half the memory budget (parsed columns take about as
    many bytes as their text; a compressed file is taken as 1/5 of its text)."""
    compressed = path.suffix.lower() in (".gz", ".zst", ".zstd", ".bz2")
    return path.stat().st_size * (5 if compressed else 1) * 2 <= budget_bytes


def _csv_chunkable(path: Path) -> bool:
    """Whether ``iter_csv_chunks`` reads the file: uncompressed (cut at any byte) and at least
    ``_CHUNKED_MIN_BYTES`` (smaller ones parse whole in a moment)."""
    compressed = path.suffix.lower() in (".gz", ".zst", ".zstd", ".bz2")
    return not compressed and path.stat().st_size >= _CHUNKED_MIN_BYTES


def stream_log(
    cfg: InteractionsDataConfig, path: Path, *, chunked: bool = True, units: TimeUnits | None = None
) -> Iterator[pa.RecordBatch]:
    """``read_log`` in record batches: what ``bucketed.split_log`` reads.

    An uncompressed CSV of ``_CHUNKED_MIN_BYTES`` or more is cut into chunks parsed on every core
    while the batches before them are converted and counted (``readers.iter_csv_chunks``); any
    fault there raises ``ChunkRefused``, and the caller reads it again with ``chunked=False``:
    then a CSV that fits the memory budget is parsed whole by Arrow's multi-threaded reader; a
    larger (compressed) one by its streaming reader, one block (16 MiB) at a time on one core
    (bounded memory, slower per row). Parquet is scanned in batches (decoded on every core)
    whatever its size, file by file. Batches may differ in their ids' type (int64 or strings:
    ``log_columns.ids``); ``units`` holds the time unit the batches agree on.
    """
    fmt = log_format(cfg, path)
    units = units if units is not None else TimeUnits(cfg.timestamp_unit)
    if fmt == "adjacency":
        yield from read_log(cfg, str(path), units=units).to_batches()
        return
    fields = _fields(cfg)
    columns = list(dict.fromkeys(fields.values()))
    text = _id_columns(cfg)
    chunked = chunked and fmt in ("csv", "tsv") and _csv_chunkable(path)
    if chunked:
        delimiter = cfg.delimiter or ("\t" if fmt == "tsv" else ",")
        # a chunk in flight holds its text and its columns (~3x its bytes): a sixteenth of the budget per
        # thread, and two at least (with a 256 MiB budget the 25M-row bench peaks at 0.68 GiB, 0.84 before)
        per_thread = int(cfg.memory_budget_mb) * 2**20 // (16 * readers.CSV_CHUNK_BYTES)
        threads = min(os.cpu_count() or 1, max(per_thread, 2))
        chunks = iter_csv_chunks(
            path, columns, delimiter=delimiter, header=cfg.header, threads=threads, text_columns=text
        )
        batches = ((path, b) for b in chunks)
    elif fmt in ("csv", "tsv") and _csv_fits(path, int(cfg.memory_budget_mb) << 20):
        table = read_columns(path, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=text)
        batches = [(path, b) for b in table.to_batches()]
        del table
    else:
        batches = iter_columns(path, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=text)
    first_row, source = 0, None
    for j, (file, batch) in enumerate(batches):
        if isinstance(batches, list):
            batches[j] = None  # converted once: the parsed batch can go
        if file != source:  # a parquet folder's next file: its own rows
            first_row, source = 0, file
        try:
            converted = convert_log(batch, fields, str(file), first_row=first_row, id_type=cfg.id_type, units=units)
        except DatasetError as e:
            if chunked:  # the whole-file reader may fail first elsewhere: its error is the one to give
                raise ChunkRefused(str(e)) from None
            raise
        yield converted
        first_row += batch.num_rows


# ---------------------------------------------------------------- ids


def _same_type(*columns: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """Integer ids everywhere stay integers; otherwise every file's ids are compared as strings."""
    if all(pa.types.is_integer(c.type) for c in columns):
        return list(columns)
    return [pc.cast(c, pa.string()) for c in columns]


def _id_kind(vocab: pa.Array) -> str:
    """meta.json ``raw_ids``: "integer" or "string" (log_columns.ids: which the rule gave)."""
    return "integer" if pa.types.is_integer(vocab.type) else "string"


def _vocabulary(column: pa.ChunkedArray) -> pa.Array:
    """Distinct raw ids, ascending: index i is the id's contiguous index."""
    distinct = pc.unique(column)
    return distinct.take(pc.array_sort_indices(distinct))


def _index(column: pa.ChunkedArray, vocab: pa.Array) -> np.ndarray:
    """Contiguous index of each raw id in ``vocab``; -1 where it is not there."""
    return pc.fill_null(pc.index_in(column, value_set=vocab), -1).to_numpy().astype(np.int64)


def _frame(log: pa.Table, users: pa.Array, items: pa.Array) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": _index(log["user"], users),
            "item_id": _index(log["item"], items),
            "timestamp": log["timestamp"].to_numpy(),
            "rating": log["rating"].to_numpy(),
        }
    )


def _compact(parts: list[pd.DataFrame], users: pa.Array, items: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Renumber ids so that every user and item left in ``parts`` is used (in place); the kept raw ids."""
    for column, vocab in (("user_id", users), ("item_id", items)):
        present = np.zeros(len(vocab), dtype=bool)  # O(rows), not a sort: ids are already < len(vocab)
        for p in parts:
            present[p[column].to_numpy()] = True
        if not present.all():
            used = np.flatnonzero(present)
            new_id = np.cumsum(present) - 1
            for p in parts:
                p[column] = new_id[p[column].to_numpy()].astype(np.int64)
            vocab = vocab.take(pa.array(used))
        if column == "user_id":
            users = vocab
        else:
            items = vocab
    return users, items


# ---------------------------------------------------------------- side files


def _items_table(
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
        names_per_item = [
            sorted({g.strip() for g in str(v).split(cfg.categories_separator) if g.strip()})
            if isinstance(v, str)
            else []
            for v in side[cfg.categories_column].to_pylist()
        ]
        names = sorted(
            {g for gs in names_per_item for g in gs}
            | ({NO_CATEGORY} if any(not gs for gs in names_per_item) else set())
        )
        index = {g: c for c, g in enumerate(names)}
        items["categories"] = [
            np.array(sorted(index[g] for g in gs) or [index[NO_CATEGORY]], dtype=np.int64) for gs in names_per_item
        ]
        vocabs[CATEGORIES_VOCAB] = pd.DataFrame({"category_id": np.arange(len(names), dtype=np.int64), "name": names})
        side = side.drop_columns([cfg.categories_column])
    else:
        items["categories"] = [np.zeros(0, dtype=np.int64)] * n
    encoded = encode_side_columns(side, cfg.items_columns, path=cfg.items_path, what="items")
    for column, values in encoded.columns.items():
        items[column] = values
    return items, vocabs | encoded.vocabs, encoded.sizes


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
    ids, keys = _same_type(ids, pa.chunked_array([raw_ids]))
    duplicated = pd.Series(ids.to_numpy(zero_copy_only=False)).duplicated()
    if duplicated.any():
        raise DatasetError(f"{p}: {what} id {ids[int(np.argmax(duplicated.to_numpy()))].as_py()!r} appears twice")
    position = pc.index_in(keys, value_set=pa.concat_arrays(ids.chunks) if ids.num_chunks else pa.array([], ids.type))
    return table.drop_columns([id_column]).take(position)  # a null position (an id the file lacks): a null row


def _users_table(
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


# ---------------------------------------------------------------- sources and cache


def _source_paths(cfg: InteractionsDataConfig, protocol: str) -> dict[str, Path]:
    if protocol == "given":
        if cfg.path:
            raise DatasetError(
                "data.protocol=given reads data.interactions.train_path / valid_path / test_path; "
                f"data.interactions.path={cfg.path!r} is for the other protocols"
            )
        if not cfg.train_path or not cfg.test_path:
            raise DatasetError(
                "data.protocol=given needs data.interactions.train_path and test_path (valid_path is optional)"
            )
        named = {"train": cfg.train_path, "valid": cfg.valid_path, "test": cfg.test_path}
    else:
        if not cfg.path:
            raise DatasetError(
                f"data.interactions.path is not set (the log to split by protocol {protocol!r}); "
                "for a split of your own use data.protocol=given with train_path / test_path"
            )
        named = {"log": cfg.path}
    named.update(items=cfg.items_path, users=cfg.users_path)
    paths = {k: Path(v) for k, v in named.items() if v}
    for key, p in paths.items():
        if not p.exists():
            setting = "path" if key == "log" else f"{key}_path"
            raise DatasetError(f"{p}: no such file or folder (data.interactions.{setting})")
    return paths


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]


def _sources(paths: dict[str, Path], expected_md5: dict[str, str]) -> list[dict[str, str]]:
    """Each source file's role, path and sha256 (the cache key), the files named in ``expected_md5``
    checked against it on the same read."""
    by_name = {f.name for p in paths.values() for f in _files(p)}
    unknown = sorted(set(expected_md5) - by_name)
    if unknown:
        raise DatasetError(
            f"data.interactions.md5 names {unknown[0]!r}, which is none of the source files {sorted(by_name)}"
        )
    sources = []
    for role, p in paths.items():
        for f in _files(p):
            want = expected_md5.get(f.name)
            digests = file_digests(f, ("md5", "sha256") if want else ("sha256",))
            if want and digests["md5"] != want.lower():
                raise DatasetError(
                    f"{f}: md5 {digests['md5']}, expected {want} (data.interactions.md5): "
                    "the file is damaged or another version; nothing was written"
                )
            sources.append({"role": role, "file": str(f), "sha256": digests["sha256"]})
    return sources


def cache_key(sources: list[dict[str, str]], options: dict[str, Any]) -> str:
    """16 hex of sha256 over the sources' roles and sha256s, every option and the code versions."""
    payload = {
        "sources": sorted((s["role"], s["sha256"]) for s in sources),
        "options": options,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- protocols


class _Prepared(Exception):
    """The dataset dir turned out to be there already (known once the sources are hashed)."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(str(out_dir))
        self.out_dir = out_dir


def _unless_prepared(
    batches: Iterator[pa.RecordBatch], prepared: Callable[[bool], Path | None]
) -> Iterator[pa.RecordBatch]:
    """``batches``, stopped by ``_Prepared`` as soon as ``prepared`` finds the dataset dir; after
    the last one, waits until it knows."""
    for batch in batches:
        if (out_dir := prepared(False)) is not None:
            raise _Prepared(out_dir)
        yield batch
    if (out_dir := prepared(True)) is not None:
        raise _Prepared(out_dir)


def _split_log(
    cfg: InteractionsDataConfig,
    path: Path,
    work: Path,
    protocol: str,
    seed: int,
    filters: dict[str, Any],
    num_heldout_users: int,
    prepared: Callable[[bool], Path | None],
):
    """The log through ``bucketed.split_log``: in memory when it fits ``memory_budget_mb``, else on
    disk; ``_Prepared`` as soon as ``prepared(wait)`` finds the dataset dir there already."""

    units: list[TimeUnits] = []  # the attempt's: a chunked one refused starts again from the first row

    def run(chunked: bool, folder: Path):
        units[:] = [TimeUnits(cfg.timestamp_unit)]
        return split_log(
            _unless_prepared(stream_log(cfg, path, chunked=chunked, units=units[0]), prepared),
            work=folder,
            label=str(path),
            protocol=protocol,
            seed=seed,
            filters=filters,
            num_heldout_users=num_heldout_users,
            memory_budget_bytes=int(cfg.memory_budget_mb) << 20,
        )

    try:
        result = run(True, work)
    except ChunkRefused:  # a column wider further down, or a fault: the whole-file reader says which
        (work / "whole").mkdir()
        result = run(False, work / "whole")
    for name, n in result.counts.items():
        if n == 0:
            raise DatasetError(
                f"{path}: protocol {protocol} (seed {seed}, filters {filters}) leaves the {name} split "
                f"empty ({list(result.counts.values())} train/valid/test rows); nothing was written"
            )
    extra_meta: dict[str, Any] = {
        "protocol_options": result.options,
        "num_raw_interactions": result.num_raw_interactions,
        "num_buckets": result.num_buckets,
        "timestamps": units[0].name if cfg.timestamp_column else "file_order",
    }
    extra_tables: dict[str, pd.DataFrame] = {}
    if result.heldout is not None:
        valid_u, test_u = result.heldout
        extra_tables[HELDOUT_USERS_FILE] = pd.DataFrame(
            {
                "user_id": np.concatenate([valid_u, test_u]).astype(np.int64),
                "split": ["valid"] * len(valid_u) + ["test"] * len(test_u),
            }
        )
        extra_meta["strong_generalization"] = {
            "num_valid_users": len(valid_u),
            "num_test_users": len(test_u),
            "recall": "hits / min(K, |relevant|)",
            "ndcg_k": 100,
        }
    parts = [result.files[s] for s in ("train", "valid", "test")]
    return parts, result.users, result.items, extra_meta, extra_tables


def _given_split(cfg: InteractionsDataConfig, paths: dict[str, Path], seed: int, filters: dict[str, Any]):
    logs: dict[str, pa.Table] = {}
    offset = 0
    units = TimeUnits(cfg.timestamp_unit)  # one unit for the three files
    for name in ("train", "valid", "test"):
        if name in paths:
            logs[name] = read_log(cfg, str(paths[name]), time_offset=offset, units=units)
            offset += logs[name].num_rows
    names = list(logs)
    user_cols = _same_type(*(logs[s]["user"] for s in names))
    item_cols = _same_type(*(logs[s]["item"] for s in names))
    for s, u, i in zip(names, user_cols, item_cols):
        logs[s] = logs[s].set_column(0, "user", u).set_column(1, "item", i)
    users, items = _vocabulary(logs["train"]["user"]), _vocabulary(logs["train"]["item"])
    train = filter_interactions(_frame(logs["train"], users, items), **filters)
    if len(train) == 0:
        raise DatasetError(f"{paths['train']}: no interactions left after the filters {filters}")
    dropped: dict[str, dict[str, int]] = {}
    parts: dict[str, pd.DataFrame] = {"train": train}
    num_items = len(items)  # a (user, item) pair as one int64, for vectorised membership
    train_pairs = train["user_id"].to_numpy() * num_items + train["item_id"].to_numpy()
    train_users = np.zeros(len(users), dtype=bool)
    train_users[train["user_id"].to_numpy()] = True
    train_items = np.zeros(len(items), dtype=bool)
    train_items[train["item_id"].to_numpy()] = True
    for name in ("valid", "test"):
        if name not in logs:
            continue
        frame = _frame(logs[name], users, items)
        u, i = frame["user_id"].to_numpy(), frame["item_id"].to_numpy()
        unknown_user = (u < 0) | ~train_users[np.maximum(u, 0)]
        unknown_item = ~unknown_user & ((i < 0) | ~train_items[np.maximum(i, 0)])
        known = ~unknown_user & ~unknown_item
        in_train = np.zeros(len(frame), dtype=bool)
        in_train[known] = np.isin(u[known] * num_items + i[known], train_pairs)
        usable = frame[known & ~in_train].reset_index(drop=True)
        parts[name] = filter_interactions(usable, min_rating=filters["min_rating"])  # duplicates: the latest kept
        dropped[name] = {
            "rows": int(logs[name].num_rows),
            "user_not_in_train": int(unknown_user.sum()),
            "item_not_in_train": int(unknown_item.sum()),
            "pair_in_train": int(in_train.sum()),
            "duplicates_or_rating": int(len(usable) - len(parts[name])),
        }
        if len(parts[name]) == 0:
            raise DatasetError(
                f"{paths[name]}: no {name} interaction is usable: of {logs[name].num_rows} rows, "
                f"{dropped[name]['user_not_in_train']} have a user with no train rows, {dropped[name]['item_not_in_train']} "
                f"an item never in train, {dropped[name]['pair_in_train']} a (user, item) pair already in train"
            )
    carved = "valid" not in parts
    if carved:
        parts["train"], parts["valid"] = carve_valid(parts["train"], fraction=cfg.valid_fraction, seed=seed)
        if len(parts["valid"]) == 0:
            raise DatasetError(
                f"{paths['train']}: data.interactions.valid_fraction={cfg.valid_fraction} carves no "
                "validation rows (every user has too few train rows); give a valid_path or a larger fraction"
            )
    ordered = [parts["train"], parts["valid"], parts["test"]]
    users, items = _compact(ordered, users, items)
    meta = {
        "given_split": {
            "valid": "carved from train" if carved else "given",
            "valid_fraction": cfg.valid_fraction if carved else None,
            "dropped": dropped,
        },
        "num_raw_interactions": int(sum(t.num_rows for t in logs.values())),
        "timestamps": units.name if cfg.timestamp_column else "file_order",
    }
    return ordered, users, items, meta, {}


# ---------------------------------------------------------------- prepare


def prepare_interactions(
    cfg: InteractionsDataConfig,
    *,
    root: str | os.PathLike,
    name: str,
    protocol: str,
    seed: int = 0,
    min_rating: float = 0.0,
    min_user_interactions: int = 0,
    min_item_interactions: int = 0,
    num_heldout_users: int = 0,
) -> Path:
    """Prepare ``<root>/<name>-<protocol>-<key>`` from the configured files and return its absolute path.

    Idempotent: a complete dir whose meta.json carries the same key is returned untouched.
    """
    if protocol not in (*PROTOCOLS, "given"):
        raise DatasetError(f"data.protocol={protocol!r}: unknown; known: {sorted((*PROTOCOLS, 'given'))}")
    fmt_ok = ("auto", "csv", "tsv", "parquet", "adjacency")
    if cfg.format not in fmt_ok:
        raise DatasetError(f"data.interactions.format={cfg.format!r}: expected one of {fmt_ok}")
    if min_rating > 0 and not cfg.rating_column:
        raise DatasetError(
            f"data.min_rating={min_rating} needs ratings: set data.interactions.rating_column (or min_rating=0)"
        )
    paths = _source_paths(cfg, protocol)
    filters = {
        "min_rating": float(min_rating),
        "min_user_interactions": int(min_user_interactions),
        "min_item_interactions": int(min_item_interactions),
    }
    options = {
        "protocol": protocol,
        "seed": seed,
        "filters": filters,
        "num_heldout_users": num_heldout_users,
        "reader": {
            k: v
            for k, v in asdict(cfg).items()
            if not k.endswith("_path") and k not in ("path", "md5", "memory_budget_mb", *_SIDE_COLUMNS)
        },
    }
    if cfg.items_path or cfg.users_path:  # keys of logs without side files stay what they were
        options["side_columns"] = {"version": SIDE_COLUMNS_VERSION, **{k: asdict(cfg)[k] for k in _SIDE_COLUMNS}}
    root_dir = Path(root).absolute()
    # The sources' sha256 (the cache key) is computed on a thread while the log is parsed; a dataset
    # dir already there is found once it is known, and the parse stops. `given` reads its files after.
    with ThreadPoolExecutor(max_workers=1) as hashing:
        hashed = hashing.submit(_sources, paths, cfg.md5)
        looked: list[Path | None] = []

        def located() -> tuple[list[dict[str, str]], str, Path]:
            sources = hashed.result()  # the hash's error (a damaged file, a wrong md5) comes first
            key = cache_key(sources, options)
            return sources, key, root_dir / f"{name}-{protocol}-{key}"

        def prepared(wait: bool) -> Path | None:
            """The dataset dir if it is complete already (None: not, or not known yet and not ``wait``)."""
            if not looked and (wait or hashed.done()):
                _, key, out_dir = located()
                looked.append(out_dir if is_prepared(out_dir, key) else None)
            return looked[0] if looked else None

        overlapped = protocol != "given" and cfg.memory_budget_mb > 0
        if not overlapped and prepared(wait=True) is not None:
            return looked[0]
        if cfg.memory_budget_mb <= 0:
            raise DatasetError(f"data.interactions.memory_budget_mb={cfg.memory_budget_mb}: must be positive (MiB)")
        root_dir.mkdir(parents=True, exist_ok=True)
        # spill and split files go beside the dataset dir (same disk: the split files are moved in); always removed
        with tempfile.TemporaryDirectory(dir=root_dir, prefix=f".{name}-{protocol}.work-") as work:
            if protocol == "given":
                parts, users, items, extra_meta, extra_tables = _given_split(cfg, paths, seed, filters)
            else:
                try:
                    parts, users, items, extra_meta, extra_tables = _split_log(
                        cfg, paths["log"], Path(work), protocol, seed, filters, num_heldout_users, prepared
                    )
                except _Prepared as e:
                    return e.out_dir
                except Exception:
                    if prepared(wait=True) is not None:  # was never to be parsed
                        return looked[0]
                    raise
            sources, key, out_dir = located()
            items_table, item_vocabs, item_features = _items_table(cfg, items)
            users_table, user_vocabs, user_features = _users_table(cfg, users)
            extra_tables.update(user_vocabs | item_vocabs)
            meta: dict[str, Any] = {
                "name": name,
                "protocol": protocol,
                "seed": seed,
                "filters": filters,
                "num_users": len(users),
                "num_items": len(items),
                "num_categories": len(item_vocabs.get(CATEGORIES_VOCAB, ())),
                "raw_ids": {"users": _id_kind(users), "items": _id_kind(items)},
                "sources": sources,
                "code_version": CODE_VERSION,
                "pipeline_version": PIPELINE_VERSION,
                "cache_key": key,
                **extra_meta,
            }
            if item_features or user_features:  # ids per categorical side column: the tables model.features builds
                meta.update(item_features=item_features, user_features=user_features)
            train, valid, test = parts
            try:
                return write_dataset_dir(
                    out_dir,
                    train=train,
                    valid=valid,
                    test=test,
                    items=items_table,
                    users=users_table,
                    meta=meta,
                    extra_tables=extra_tables,
                )
            except ValueError as e:
                raise DatasetError(f"{out_dir}: {e}") from None
