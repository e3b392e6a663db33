"""Readers for interaction logs in the formats users bring: CSV / TSV (any delimiter, header or
not, gzip / zstd by extension), a parquet file or a folder of them, and the adjacency lists of
LightGCN-family benchmarks (``user item item ...`` per line).

Every reader returns a pyarrow Table holding only the columns asked for, under their source
names; every fault is a ``DatasetError`` naming the file, the line (or row) and the field.
A UTF-8 byte-order mark and CRLF line endings are read as if absent.
"""

from __future__ import annotations

import csv
import io
import os
import queue
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as pads

from data_pipelines.errors import DatasetError

__all__ = [
    "CSV_CHUNK_BYTES",
    "FORMATS",
    "ChunkRefused",
    "delimited_header",
    "detect_format",
    "iter_columns",
    "iter_csv_chunks",
    "iter_parquet_tables",
    "parquet_batches",
    "parquet_files",
    "read_adjacency",
    "read_columns",
]

FORMATS = ("csv", "tsv", "parquet", "adjacency")
_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2")
_CSV_BLOCK_BYTES = 1 << 24
# Text per parse task of ``iter_csv_chunks`` (two of Arrow's blocks): ~1.3M rows of a ratings file,
# small enough that a few in flight hold far less than the parsed file, big enough that a task's
# fixed cost (a reader, a Python call) is noise.
CSV_CHUNK_BYTES = 1 << 25
_NEWLINE_PROBE_BYTES = 1 << 16  # read around a chunk's nominal end to find the next line end


def detect_format(path: Path) -> str:
    """The format of ``path`` from its name: a folder is parquet; ``.csv[.gz]`` csv; ``.tsv`` / ``.tab``
    tsv; ``.parquet`` / ``.pq`` parquet; ``.txt`` adjacency (LightGCN's files)."""
    if path.is_dir():
        return "parquet"
    name = path.name.lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    ext = Path(name).suffix
    by_ext = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet", ".txt": "adjacency"}
    if ext not in by_ext:
        raise DatasetError(
            f"{path}: cannot tell the format from the name; set data.interactions.format to one of {FORMATS}"
        )
    return by_ext[ext]


def _open_text(path: Path) -> io.TextIOBase:
    stream = pa.input_stream(str(path), compression="detect")  # .gz / .zst / .bz2 by extension
    return io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")


def _first_bad_csv_row(path: Path, delimiter: str, header: bool) -> str:
    """Where a CSV the Arrow parser refused goes wrong: the first line whose field count differs."""
    try:
        with _open_text(path) as f:
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


def _read_csv_header(path: Path, columns: list[str] | None, delimiter: str) -> list[str]:
    """The header's names; a DatasetError when one of ``columns`` is not among them."""
    read = pacsv.ReadOptions(block_size=_CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            names = pacsv.open_csv(stream, read_options=read, parse_options=parse).schema.names
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            raise DatasetError(f"{path}: empty file (no header, no rows)") from None
        raise DatasetError(f"{path}: not readable as CSV ({_first_bad_csv_row(path, delimiter, True)}; {e})") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise DatasetError(
            f"{path}: no column(s) {missing} in the header {names} (delimiter {delimiter!r}); "
            "set data.interactions.*_column to the right names"
        )
    return names


def _source_names(columns, header: bool) -> list[str]:
    """The names Arrow gives ``columns``: their own with a header, else ``f<position>``."""
    return list(columns) if header else [f"f{int(c)}" for c in columns]


def _read_csv(
    path: Path, columns: list[str] | None, delimiter: str, header: bool, text_columns: list[str] = ()
) -> pa.Table:
    read = pacsv.ReadOptions(autogenerate_column_names=not header, block_size=_CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    if header:  # read the header row alone first, so a missing column is named before any parsing
        _read_csv_header(path, columns, delimiter)
    text = {name: pa.string() for name in _source_names(text_columns, header)}  # ids: never parsed here
    if columns is None:
        convert = pacsv.ConvertOptions(column_types=text)
    else:
        convert = pacsv.ConvertOptions(include_columns=_source_names(columns, header), column_types=text)
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
        raise DatasetError(
            f"{path}: not readable as CSV ({_first_bad_csv_row(path, delimiter, header)}; {e})"
        ) from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    if not header and columns is not None:
        table = table.rename_columns(columns)
    return table


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


def _read_parquet(path: Path, columns: list[str] | None) -> pa.Table:
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


def _csv_batches(
    path: Path, columns: list[str], delimiter: str, header: bool, text_columns: list[str] = ()
) -> Iterator[pa.RecordBatch]:
    """``columns`` of a CSV in record batches of one parse block each (~16 MiB of text): bounded memory.

    Column types are inferred from the first block (Arrow's streaming reader); a later value that
    does not fit them is an error naming the file, the line and, where Arrow says, the column.
    """
    read = pacsv.ReadOptions(autogenerate_column_names=not header, block_size=_CSV_BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    names = _source_names(columns, header)
    text = {name: pa.string() for name in _source_names(text_columns, header)}
    convert = pacsv.ConvertOptions(include_columns=names, column_types=text)
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
                _read_csv_header(path, columns, delimiter)
            raise DatasetError(f"{path}: fewer fields than the column positions {columns} asked for") from None
        raise DatasetError(
            f"{path}: not readable as CSV ({_first_bad_csv_row(path, delimiter, header)}; {e})"
        ) from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    finally:
        if reader is not None:
            reader.close()


class ChunkRefused(Exception):
    """``iter_csv_chunks`` met a chunk it cannot parse as the first chunk's column types (a value of
    a wider type further down, or a fault): read the file the usual way, which gives the whole-file
    types or the usual error."""


def _chunk_starts(path: Path, chunk_bytes: int) -> list[int]:
    """Byte offsets where the chunks start: 0, then after the first line end at or past every
    ``chunk_bytes`` from the previous start (Arrow, without newlines in values, cuts its blocks at
    line ends too, so a chunk parses as its lines do within the whole file)."""
    size = path.stat().st_size
    starts = [0]
    with open(path, "rb", buffering=0) as f:
        pos = chunk_bytes
        while pos < size:
            probe = os.pread(f.fileno(), _NEWLINE_PROBE_BYTES, pos)
            if not probe:
                break
            end = probe.find(b"\n")
            if end < 0:
                pos += len(probe)  # a line longer than the probe: look further
                continue
            start = pos + end + 1
            if start >= size:
                break
            starts.append(start)
            pos = start + chunk_bytes
    return starts


def iter_csv_chunks(
    path: str | os.PathLike,
    columns: list[str],
    *,
    delimiter: str,
    header: bool,
    threads: int,
    chunk_bytes: int = 0,
    text_columns: list[str] = (),
) -> Iterator[pa.RecordBatch]:
    """``iter_columns`` of an uncompressed CSV / TSV, parsed ``threads`` chunks at a time while the
    caller works on the batches before them: file order, bounded memory (``threads + 1`` chunks of
    ~``chunk_bytes`` of text and their columns; 0: ``CSV_CHUNK_BYTES``).

    The file is cut at line ends into chunks of about ``chunk_bytes``. The first is parsed alone
    (on every core) and its inferred column types are imposed on the others, each parsed on one
    thread. A chunk that does not parse so raises ``ChunkRefused`` (after the batches before it):
    the caller reads the file the usual way instead. A file read to the end gave exactly the
    columns ``read_columns`` gives: every value converts to the first chunk's types, which are
    then the whole file's (Arrow widens a column only for a value that does not convert).
    """
    path = Path(path)
    names = _read_csv_header(path, columns, delimiter) if header else None
    starts = _chunk_starts(path, chunk_bytes or CSV_CHUNK_BYTES)
    ends = [*starts[1:], path.stat().st_size]
    parse = pacsv.ParseOptions(delimiter=delimiter)
    selected = _source_names(columns, header)
    text = {name: pa.string() for name in _source_names(text_columns, header)}
    buffers: queue.SimpleQueue = queue.SimpleQueue()  # chunk text buffers, reused: fresh pages cost here
    for _ in range(threads):
        buffers.put(np.empty(max(e - s for s, e in zip(starts, ends)), dtype=np.uint8))

    def read(k: int, types: dict | None) -> pa.Table:
        buf = buffers.get()
        try:
            n = 0
            with open(path, "rb", buffering=0) as f:
                while n < ends[k] - starts[k]:
                    got = os.preadv(f.fileno(), [memoryview(buf)[n : ends[k] - starts[k]]], starts[k] + n)
                    if not got:
                        raise ChunkRefused(f"{path}: the file changed while it was read")
                    n += got
            first = k == 0
            read_options = pacsv.ReadOptions(
                use_threads=first,
                block_size=_CSV_BLOCK_BYTES,
                autogenerate_column_names=not header,
                column_names=names if header and not first else None,
            )
            convert = pacsv.ConvertOptions(include_columns=selected, column_types=types or text)
            return pacsv.read_csv(
                pa.BufferReader(pa.py_buffer(buf[:n])),
                read_options=read_options,
                parse_options=parse,
                convert_options=convert,
            )
        except (OSError, pa.ArrowException) as e:
            raise ChunkRefused(f"{path}: bytes {starts[k]}-{ends[k]}: {e}") from None
        finally:
            buffers.put(buf)

    first = read(0, None)
    types = {name: first.schema.field(name).type for name in selected}
    num_rows = first.num_rows
    yield from _renamed(first, columns, header).to_batches()
    del first
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque = deque()
        try:
            for k in range(1, len(starts)):
                pending.append(pool.submit(read, k, types))
                if len(pending) > threads:  # `threads` chunks parse while the caller works on one
                    table = pending.popleft().result()
                    num_rows += table.num_rows
                    yield from _renamed(table, columns, header).to_batches()
            while pending:
                table = pending.popleft().result()
                num_rows += table.num_rows
                yield from _renamed(table, columns, header).to_batches()
        finally:
            for future in pending:
                future.cancel()
    if num_rows == 0:
        raise ChunkRefused(f"{path}: no rows")


def _renamed(table: pa.Table, columns: list[str], header: bool) -> pa.Table:
    return table if header else table.rename_columns(columns)


def parquet_batches(path: Path, file: Path, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``columns`` of one file of the parquet log at ``path`` in record batches (decoded on every core)."""
    dataset = _parquet_file(path, file, columns)
    try:  # a few batches read ahead at a time: memory bounded by the row groups
        yield from dataset.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=2, fragment_readahead=1)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{file}: not readable as parquet, the file is damaged ({e})") from None


_DEFAULT_DELIMITERS = {"csv": ",", "tsv": "\t"}


def _columnar_log(path: str | os.PathLike, fmt: str) -> tuple[Path, str]:
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
    path, fmt = _columnar_log(path, fmt)
    num_rows = 0
    if fmt == "parquet":
        for file in parquet_files(path):
            for batch in parquet_batches(path, file, columns, batch_rows):
                num_rows += batch.num_rows
                if batch.num_rows:
                    yield file, batch
    else:
        for batch in _csv_batches(path, columns, delimiter or _DEFAULT_DELIMITERS[fmt], header, text_columns):
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
    path, fmt = _columnar_log(path, fmt)
    if fmt == "parquet":
        table = _read_parquet(path, columns)
    else:
        table = _read_csv(path, columns, delimiter or _DEFAULT_DELIMITERS[fmt], header, text_columns)
    if table.num_rows == 0:
        raise DatasetError(f"{path}: no rows (a header alone, or an empty file)")
    return table


def delimited_header(path: Path, columns: list[str]) -> str | None:
    """ "csv" or "tsv" when the first line of ``path`` is a header naming every one of ``columns``
    (split at commas or tabs), else None: what tells a ``.txt`` CSV from an adjacency list."""
    try:
        with _open_text(path) as f:
            first = f.readline().strip()
    except (OSError, UnicodeDecodeError):
        return None
    for fmt, delimiter in (("tsv", "\t"), ("csv", ",")):
        names = [n.strip().strip('"') for n in first.split(delimiter)]
        if len(names) > 1 and all(c in names for c in columns):
            return fmt
    return None


_ADJACENCY_HINT = (
    "adjacency lists are `user item item ...` per line, integers apart by spaces; for a CSV / TSV log "
    "set data.interactions.format=csv or tsv"
)
_INTEGER_TOKEN = r"^[+-]?[0-9]+$"


def read_adjacency(path: str | os.PathLike) -> pa.Table:
    """A LightGCN-style file: one line per user, ``user item item ...``, space-separated integers.

    Returns columns ``user``, ``item`` (the tokens as text: ``log_columns.ids`` reads them by the
    id rule, so "007" and "7" stay two ids unless ``id_type=int``) and ``position`` (the pair's
    running index in the file, which orders a user's items when the data has no timestamps). A
    line with a user and no items adds nothing; blank lines are skipped.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    users: list[str] = []
    items: list[str] = []
    lines: list[int] = []  # the line of each user's run of items: first pair index -> line
    starts: list[int] = []
    try:
        with _open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                tokens = line.split()
                if len(tokens) < 2:
                    if len(tokens) == 1 and not _is_integer(tokens[0]):
                        raise DatasetError(
                            f"{path}: line {line_no}: user id {tokens[0]!r} is not an integer; {_ADJACENCY_HINT}"
                        )
                    continue
                lines.append(line_no)
                starts.append(len(items))
                users.extend([tokens[0]] * (len(tokens) - 1))
                items.extend(tokens[1:])
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    if not users:
        raise DatasetError(f"{path}: no interactions (every line is empty or a user without items)")
    user, item = pa.array(users, pa.string()), pa.array(items, pa.string())
    for field, column in (("user id", user), ("item id", item)):
        bad = pc.invert(pc.match_substring_regex(column, _INTEGER_TOKEN))
        if pc.any(bad).as_py():
            pair = int(pc.index(bad, True).as_py())
            line_no = lines[int(np.searchsorted(starts, pair, side="right")) - 1]
            raise DatasetError(
                f"{path}: line {line_no}: {field} {column[pair].as_py()!r} is not an integer; {_ADJACENCY_HINT}"
            )
    return pa.table({"user": user, "item": item, "position": np.arange(len(users), dtype=np.int64)})


def _is_integer(token: str) -> bool:
    return token.lstrip("+-").isdigit()
