"""CSV / TSV logs (any delimiter, header or not, gzip / zstd by extension) read whole or one parse
block at a time; a refusal names the file and the first line whose field count differs."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from data_pipelines.errors import DatasetError

CSV_BLOCK_BYTES = 1 << 24


def open_text(path: Path) -> io.TextIOBase:
    stream = pa.input_stream(str(path), compression="detect")  # .gz / .zst / .bz2 by extension
    return io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")


def first_bad_csv_row(path: Path, delimiter: str, header: bool) -> str:
    """Where a CSV the Arrow parser refused goes wrong: the first line whose field count differs."""
    try:
        with open_text(path) as f:
            expected = None
            for line_no, row in enumerate(csv.reader(f, delimiter=delimiter), start=1):
                if not row:
                    continue
                if expected is None:
                    expected = len(row)
                elif len(row) != expected:
                    return f"line {line_no} has {len(row)} field(s), line 1 has {expected} (delimiter {delimiter!r})"
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return str(e)
    return "no line with a different field count found"


def read_csv_header(path: Path, columns: list[str] | None, delimiter: str) -> list[str]:
    """The header's names; a DatasetError when one of ``columns`` (None: any column) is not among them, or is
    there twice (Arrow would read the first silently: which one is meant, only the user knows)."""
    read = pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            names = pacsv.open_csv(stream, read_options=read, parse_options=parse).schema.names
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            raise DatasetError(f"{path}: empty file (no header, no rows)") from None
        raise DatasetError(f"{path}: not readable as CSV ({first_bad_csv_row(path, delimiter, True)}; {e})") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise DatasetError(
            f"{path}: no column(s) {missing} in the header {names} (delimiter {delimiter!r}); "
            "set data.interactions.*_column to the right names"
        )
    twice = sorted({c for c in (names if columns is None else columns) if names.count(c) > 1})
    if twice:
        raise DatasetError(
            f"{path}: column(s) {twice} appear more than once in the header {names} (delimiter {delimiter!r}); "
            "which is meant is unknown: rename or drop the copies"
        )
    return names


def source_names(columns, header: bool) -> list[str]:
    """The names Arrow gives ``columns``: their own with a header, else ``f<position>``."""
    return list(columns) if header else [f"f{int(c)}" for c in columns]


def read_csv(
    path: Path, columns: list[str] | None, delimiter: str, header: bool, text_columns: list[str] = ()
) -> pa.Table:
    read = pacsv.ReadOptions(autogenerate_column_names=not header, block_size=CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    if header:  # read the header row alone first, so a missing column is named before any parsing
        read_csv_header(path, columns, delimiter)
    text = {name: pa.string() for name in source_names(text_columns, header)}  # ids: never parsed here
    if columns is None:
        convert = pacsv.ConvertOptions(column_types=text)
    else:
        convert = pacsv.ConvertOptions(include_columns=source_names(columns, header), column_types=text)
    try:
        table = pacsv.read_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=read,
            parse_options=parse,
            convert_options=convert,
        )
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            raise DatasetError(f"{path}: empty file") from None
        if not header and "include_columns" in str(e):
            raise DatasetError(f"{path}: fewer fields than the column positions {columns} asked for") from None
        raise DatasetError(f"{path}: not readable as CSV ({first_bad_csv_row(path, delimiter, header)}; {e})") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    if not header and columns is not None:
        table = table.rename_columns(columns)
    return table


def csv_batches(
    path: Path, columns: list[str], delimiter: str, header: bool, text_columns: list[str] = ()
) -> Iterator[pa.RecordBatch]:
    """``columns`` of a CSV in record batches of one parse block each (~16 MiB of text): bounded memory.

    Column types are inferred from the first block (Arrow's streaming reader); a later value that
    does not fit them is an error naming the file, the line and, where Arrow says, the column.
    """
    read = pacsv.ReadOptions(autogenerate_column_names=not header, block_size=CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    names = source_names(columns, header)
    text = {name: pa.string() for name in source_names(text_columns, header)}
    convert = pacsv.ConvertOptions(include_columns=names, column_types=text)
    if header:  # a missing or repeated column named before any parsing
        read_csv_header(path, columns, delimiter)
    reader = None
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=read,
            parse_options=parse,
            convert_options=convert,
        )
        for batch in reader:
            yield batch if header else batch.rename_columns(columns)
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            raise DatasetError(f"{path}: empty file") from None
        if "include_columns" in str(e):
            if header:  # names the missing column(s) and the header's
                read_csv_header(path, columns, delimiter)
            raise DatasetError(f"{path}: fewer fields than the column positions {columns} asked for") from None
        raise DatasetError(f"{path}: not readable as CSV ({first_bad_csv_row(path, delimiter, header)}; {e})") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    finally:
        if reader is not None:
            reader.close()
