"""An uncompressed CSV / TSV cut at line ends into chunks parsed on several threads, in file order:
what a large log is read by while the batches before are converted (``interactions.log.stream_log``)."""

from __future__ import annotations

import os
import queue
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from data_pipelines.readers.delimited import CSV_BLOCK_BYTES, read_csv_header, source_names

# Text per parse task of ``iter_csv_chunks`` (two of Arrow's blocks): ~1.3M rows of a ratings file,
# small enough that a few in flight hold far less than the parsed file, big enough that a task's
# fixed cost (a reader, a Python call) is noise.
CSV_CHUNK_BYTES = 1 << 25
_NEWLINE_PROBE_BYTES = 1 << 16  # read around a chunk's nominal end to find the next line end


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


class _ChunkParser:
    """Parses chunk k of the file on the calling thread, into one of ``threads`` reused text buffers."""

    def __init__(
        self,
        path: Path,
        names: list[str] | None,
        columns: list[str],
        *,
        delimiter: str,
        header: bool,
        threads: int,
        chunk_bytes: int,
        text_columns: list[str],
    ) -> None:
        self.path, self.names, self.header = path, names, header
        self.starts = _chunk_starts(path, chunk_bytes)
        self.ends = [*self.starts[1:], path.stat().st_size]
        self.parse = pacsv.ParseOptions(delimiter=delimiter)
        self.selected = source_names(columns, header)
        self.text = {name: pa.string() for name in source_names(text_columns, header)}
        self.buffers: queue.SimpleQueue = queue.SimpleQueue()  # reused: fresh pages cost here
        for _ in range(threads):
            self.buffers.put(np.empty(max(e - s for s, e in zip(self.starts, self.ends)), dtype=np.uint8))

    def __call__(self, k: int, types: dict | None) -> pa.Table:
        """Chunk ``k``, its columns typed by ``types`` (None: inferred, on every core: the first chunk)."""
        start, end = self.starts[k], self.ends[k]
        buf = self.buffers.get()
        try:
            n = self._read_into(buf, start, end)
            first = k == 0
            read_options = pacsv.ReadOptions(
                use_threads=first,
                block_size=CSV_BLOCK_BYTES,
                autogenerate_column_names=not self.header,
                column_names=self.names if self.header and not first else None,
            )
            convert = pacsv.ConvertOptions(include_columns=self.selected, column_types=types or self.text)
            return pacsv.read_csv(
                pa.BufferReader(pa.py_buffer(buf[:n])),
                read_options=read_options,
                parse_options=self.parse,
                convert_options=convert,
            )
        except (OSError, pa.ArrowException) as e:
            raise ChunkRefused(f"{self.path}: bytes {start}-{end}: {e}") from None
        finally:
            self.buffers.put(buf)

    def _read_into(self, buf: np.ndarray, start: int, end: int) -> int:
        n = 0
        with open(self.path, "rb", buffering=0) as f:
            while n < end - start:
                got = os.preadv(f.fileno(), [memoryview(buf)[n : end - start]], start + n)
                if not got:
                    raise ChunkRefused(f"{self.path}: the file changed while it was read")
                n += got
        return n


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
    names = read_csv_header(path, columns, delimiter) if header else None
    parse = _ChunkParser(
        path,
        names,
        columns,
        delimiter=delimiter,
        header=header,
        threads=threads,
        chunk_bytes=chunk_bytes or CSV_CHUNK_BYTES,
        text_columns=text_columns,
    )
    first = parse(0, None)
    types = {name: first.schema.field(name).type for name in parse.selected}
    num_rows = first.num_rows
    yield from _renamed(first, columns, header).to_batches()
    del first
    with closing(_later_chunks(parse, types, threads)) as tables:
        for table in tables:
            num_rows += table.num_rows
            yield from _renamed(table, columns, header).to_batches()
    if num_rows == 0:
        raise ChunkRefused(f"{path}: no rows")


def _later_chunks(parse: _ChunkParser, types: dict, threads: int) -> Iterator[pa.Table]:
    """Chunks 1.. in file order, ``threads`` parsing while the caller works on one."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque = deque()
        try:
            for k in range(1, len(parse.starts)):
                pending.append(pool.submit(parse, k, types))
                if len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _renamed(table: pa.Table, columns: list[str], header: bool) -> pa.Table:
    return table if header else table.rename_columns(columns)
