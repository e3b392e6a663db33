"""A log's format from its name, and its named columns read whole or in batches, whatever the format."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from data_pipelines.errors import DatasetError
from data_pipelines.readers.delimited import csv_batches, open_text, read_csv
from data_pipelines.readers.parquet import parquet_batches, parquet_files, read_parquet

FORMATS = ("csv", "tsv", "parquet", "adjacency")
COMPRESSED = (".gz", ".zst", ".zstd", ".bz2")
_DEFAULT_DELIMITERS = {"csv": ",", "tsv": "\t"}


def detect_format(path: Path) -> str:
    """The format of ``path`` from its name: a folder is parquet; ``.csv[.gz]`` csv; ``.tsv`` / ``.tab``
    tsv; ``.parquet`` / ``.pq`` parquet; ``.txt`` adjacency (LightGCN's files)."""
    if path.is_dir():
        return "parquet"
    name = path.name.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    ext = Path(name).suffix
    by_ext = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet", ".txt": "adjacency"}
    if ext not in by_ext:
        raise DatasetError(
            f"{path}: cannot tell the format from the name; set data.interactions.format to one of {FORMATS}"
        )
    return by_ext[ext]


def columnar_log(path: str | os.PathLike, fmt: str) -> tuple[Path, str]:
    """(path, format) of a log with named columns: csv, tsv or parquet, else a clear error."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in ("csv", "tsv", "parquet"):
        raise DatasetError(f"{path}: format {fmt!r} holds no named columns; expected csv, tsv or parquet")
    return path, fmt


def iter_columns(
    path: str | os.PathLike,
    columns: list[str],
    *,
    fmt: str = "auto",
    delimiter: str = "",
    header: bool = True,
    batch_rows: int = 1 << 20,
    text_columns: list[str] = (),
) -> Iterator[tuple[Path, pa.RecordBatch]]:
    """``read_columns`` in record batches, for logs larger than memory, each with the file it comes
    from (a folder of parquet files: file by file, each typed as the file has it): the same errors,
    found as the batches are read (a header without rows: ``no rows`` once the file ends)."""
    path, fmt = columnar_log(path, fmt)
    num_rows = 0
    if fmt == "parquet":
        for file in parquet_files(path):
            for batch in parquet_batches(path, file, columns, batch_rows):
                num_rows += batch.num_rows
                if batch.num_rows:
                    yield file, batch
    else:
        for batch in csv_batches(path, columns, delimiter or _DEFAULT_DELIMITERS[fmt], header, text_columns):
            num_rows += batch.num_rows
            if batch.num_rows:
                yield path, batch
    if num_rows == 0:
        raise DatasetError(f"{path}: no rows (a header alone, or an empty file)")


def read_columns(
    path: str | os.PathLike,
    columns: list[str] | None,
    *,
    fmt: str = "auto",
    delimiter: str = "",
    header: bool = True,
    text_columns: list[str] = (),
) -> pa.Table:
    """``columns`` of the log at ``path`` (names, or 0-based positions as strings when ``header`` is
    false; None: every column); ``text_columns`` of a CSV are read as strings, never parsed (ids).
    A folder of parquet files whose files type a column differently: ``iter_parquet_tables``."""
    path, fmt = columnar_log(path, fmt)
    if fmt == "parquet":
        table = read_parquet(path, columns)
    else:
        table = read_csv(path, columns, delimiter or _DEFAULT_DELIMITERS[fmt], header, text_columns)
    if table.num_rows == 0:
        raise DatasetError(f"{path}: no rows (a header alone, or an empty file)")
    return table


def delimited_header(path: Path, columns: list[str]) -> str | None:
    """ "csv" or "tsv" when the first line of ``path`` is a header naming every one of ``columns``
    (split at commas or tabs), else None: what tells a ``.txt`` CSV from an adjacency list."""
    try:
        with open_text(path) as f:
            first = f.readline().strip()
    except (OSError, UnicodeDecodeError):
        return None
    for fmt, delimiter in (("tsv", "\t"), ("csv", ",")):
        names = [n.strip().strip('"') for n in first.split(delimiter)]
        if len(names) > 1 and all(c in names for c in columns):
            return fmt
    return None
