"""One interaction log read as columns user, item (raw ids), timestamp (int64), rating (float32):
whole (``read_log``) or in record batches (``stream_log``, what ``bucketed.split_log`` reads)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.config import InteractionsDataConfig
from data_pipelines.errors import DatasetError
from data_pipelines.interactions.ids import same_type
from data_pipelines.log_columns import TimeUnits, convert_log
from data_pipelines.log_columns import ids as raw_ids_of
from data_pipelines.readers import csv_chunks
from data_pipelines.readers.adjacency import read_adjacency
from data_pipelines.readers.columns import (
    COMPRESSED,
    columnar_log,
    delimited_header,
    detect_format,
    iter_columns,
    read_columns,
)
from data_pipelines.readers.csv_chunks import ChunkRefused, iter_csv_chunks
from data_pipelines.readers.parquet import iter_parquet_tables

_CHUNKED_MIN_BYTES = 1 << 26  # an uncompressed CSV this big is parsed in chunks (readers/csv_chunks.py)


def _fields(cfg: InteractionsDataConfig) -> dict[str, str]:
    """Canonical column -> the log's column (timestamp and rating only when configured)."""
    fields = {"user": cfg.user_column, "item": cfg.item_column}
    if cfg.timestamp_column:
        fields["timestamp"] = cfg.timestamp_column
    if cfg.rating_column:
        fields["rating"] = cfg.rating_column
    return fields


def id_columns(cfg: InteractionsDataConfig) -> list[str]:
    """The log's id columns: read as text, never parsed by the CSV reader (``log_columns.ids`` reads them)."""
    return list(dict.fromkeys((cfg.user_column, cfg.item_column)))


def log_format(cfg: InteractionsDataConfig, path: Path) -> str:
    """``data.interactions.format``, or with "auto" the one the name tells; a ``.txt`` file whose
    first line is a header naming the user and item columns (split at commas or tabs) is a CSV / TSV."""
    if cfg.format != "auto":
        return cfg.format
    fmt = detect_format(path)
    if fmt == "adjacency" and cfg.header:
        return delimited_header(path, id_columns(cfg)) or fmt
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
    units = units if units is not None else TimeUnits(cfg.timestamp_unit)
    if fmt != "parquet":
        columns = list(dict.fromkeys(fields.values()))
        text = id_columns(cfg)
        table = read_columns(p, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=text)
        return convert_log(table, fields, str(p), time_offset=time_offset, id_type=cfg.id_type, units=units)
    return _read_parquet_log(cfg, p, fields, time_offset, units)


def _read_parquet_log(
    cfg: InteractionsDataConfig, p: Path, fields: dict[str, str], time_offset: int, units: TimeUnits
) -> pa.Table:
    """A parquet log file by file, positions running on across the files, ids of one type."""
    columnar_log(p, "parquet")  # a missing path: named
    tables, first_row = [], 0
    for file, table in iter_parquet_tables(p, list(dict.fromkeys(fields.values()))):
        offset = time_offset + first_row
        tables.append(convert_log(table, fields, str(file), time_offset=offset, id_type=cfg.id_type, units=units))
        first_row += table.num_rows
    if first_row == 0:
        raise DatasetError(f"{p}: no rows (a header alone, or an empty file)")
    users, items = same_type(*(t["user"] for t in tables)), same_type(*(t["item"] for t in tables))
    tables = [t.set_column(0, "user", u).set_column(1, "item", i) for t, u, i in zip(tables, users, items)]
    return pa.concat_tables(tables)


def _csv_fits(path: Path, budget_bytes: int) -> bool:
    """Whether a CSV / TSV file parses within half the memory budget (parsed columns take about as
    many bytes as their text; a compressed file is taken as 1/5 of its text)."""
    compressed = path.suffix.lower() in COMPRESSED
    return path.stat().st_size * (5 if compressed else 1) * 2 <= budget_bytes


def _csv_chunkable(path: Path) -> bool:
    """Whether ``iter_csv_chunks`` reads the file: uncompressed (cut at any byte) and at least
    ``_CHUNKED_MIN_BYTES`` (smaller ones parse whole in a moment)."""
    compressed = path.suffix.lower() in COMPRESSED
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
    chunked = chunked and fmt in ("csv", "tsv") and _csv_chunkable(path)
    fields = _fields(cfg)
    batches = _parsed_batches(cfg, path, fmt, list(dict.fromkeys(fields.values())), chunked)
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


def _parsed_batches(
    cfg: InteractionsDataConfig, path: Path, fmt: str, columns: list[str], chunked: bool
) -> Iterable[tuple[Path, pa.RecordBatch]]:
    """(file, parsed batch) by the reader ``stream_log`` picks; a list when the file was parsed whole."""
    text = id_columns(cfg)
    if chunked:
        delimiter = cfg.delimiter or ("\t" if fmt == "tsv" else ",")
        # a chunk in flight holds its text and its columns (~3x its bytes): a sixteenth of the budget per
        # thread, and two at least (with a 256 MiB budget the 25M-row bench peaks at 0.68 GiB, 0.84 before)
        per_thread = int(cfg.memory_budget_mb) * 2**20 // (16 * csv_chunks.CSV_CHUNK_BYTES)
        threads = min(os.cpu_count() or 1, max(per_thread, 2))
        chunks = iter_csv_chunks(
            path, columns, delimiter=delimiter, header=cfg.header, threads=threads, text_columns=text
        )
        return ((path, b) for b in chunks)
    if fmt in ("csv", "tsv") and _csv_fits(path, int(cfg.memory_budget_mb) << 20):
        table = read_columns(path, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=text)
        return [(path, b) for b in table.to_batches()]
    return iter_columns(path, columns, fmt=fmt, delimiter=cfg.delimiter, header=cfg.header, text_columns=text)
