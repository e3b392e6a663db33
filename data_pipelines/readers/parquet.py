"""Parquet logs: one file, or a folder of them read file by file, each as it types its columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from data_pipelines.errors import DatasetError


def parquet_files(path: Path) -> list[Path]:
    """The parquet files of ``path`` (itself, or a folder's files as Arrow's dataset discovery finds
    them: names starting with "." or "_" skipped)."""
    if not path.is_dir():
        return [path]
    try:
        return [Path(f) for f in pads.dataset(str(path), format="parquet").files]
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: not readable as parquet ({e})") from None


def _parquet_file(path: Path, file: Path, columns: list[str] | None) -> pads.Dataset:
    """One file of the log at ``path``, its columns checked: errors name the file and the column."""
    try:
        dataset = pads.dataset(str(file), format="parquet")
        names = dataset.schema.names
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{file}: not readable as parquet ({e})") from None
    missing = [c for c in columns or () if c not in names]
    if missing and file != path:  # one file of a folder: the others have it
        raise DatasetError(f"{path}: column {missing[0]!r} is missing in {file}; its columns are {names}")
    if missing:
        raise DatasetError(f"{path}: no column(s) {missing}; columns are {names}")
    return dataset


def iter_parquet_tables(path: Path, columns: list[str] | None) -> Iterator[tuple[Path, pa.Table]]:
    """(file, its ``columns``) for each file of the parquet log at ``path``, as each file types them."""
    for file in parquet_files(path):
        dataset = _parquet_file(path, file, columns)
        try:
            yield file, dataset.to_table(columns=columns)
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{file}: not readable as parquet, the file is damaged ({e})") from None


def read_parquet(path: Path, columns: list[str] | None) -> pa.Table:
    """Every file's ``columns`` as one table; files that type a column differently are named."""
    tables = list(iter_parquet_tables(path, columns))
    try:
        return pa.concat_tables([t for _, t in tables], promote_options="permissive")
    except (pa.ArrowException, TypeError):
        first_file, first = tables[0]
        for file, table in tables[1:]:
            for name in first.column_names:
                if name in table.column_names and table.schema.field(name).type != first.schema.field(name).type:
                    raise DatasetError(
                        f"{path}: column {name!r} is {table.schema.field(name).type} in {file} but "
                        f"{first.schema.field(name).type} in {first_file}; give every file the same types"
                    ) from None
        raise


def parquet_batches(path: Path, file: Path, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``columns`` of one file of the parquet log at ``path`` in record batches (decoded on every core)."""
    dataset = _parquet_file(path, file, columns)
    try:  # a few batches read ahead at a time: memory bounded by the row groups
        yield from dataset.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=2, fragment_readahead=1)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{file}: not readable as parquet, the file is damaged ({e})") from None
