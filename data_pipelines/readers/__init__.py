"""Readers for interaction logs in the formats users bring: CSV / TSV (any delimiter, header or
not, gzip / zstd by extension), a parquet file or a folder of them, and the adjacency lists of
LightGCN-family benchmarks (``user item item ...`` per line). One module a format: ``delimited``,
``csv_chunks`` (a large CSV on several threads), ``parquet``, ``adjacency``; ``columns`` tells the
format and reads any of them.

Every reader returns a pyarrow Table holding only the columns asked for, under their source
names; every fault is a ``DatasetError`` naming the file, the line (or row) and the field.
A UTF-8 byte-order mark and CRLF line endings are read as if absent.
"""

from __future__ import annotations

from data_pipelines.readers.adjacency import read_adjacency
from data_pipelines.readers.columns import FORMATS, delimited_header, detect_format, iter_columns, read_columns
from data_pipelines.readers.csv_chunks import CSV_CHUNK_BYTES, ChunkRefused, iter_csv_chunks
from data_pipelines.readers.parquet import iter_parquet_tables, parquet_batches, parquet_files

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
