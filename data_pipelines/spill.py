"""Record batches kept in memory up to a byte budget, then on disk: the out-of-core store of ``bucketed``.

A store appends batches of one schema (``map`` changes it for every batch held); past its budget it writes what it holds, and every later
batch, to an Arrow IPC stream file (uncompressed: written and read back at disk speed). Reading
uses ordinary reads, not a memory map, so the pages read do not count as the process's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["BatchStore"]


class BatchStore:
    """Batches appended in order and read back in that order, any number of times."""

    def __init__(self, path: Path, budget_bytes: int) -> None:
        self.path, self.budget_bytes = path, budget_bytes
        self.num_rows = 0
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._writer: ipc.RecordBatchStreamWriter | None = None
        self._on_disk = False

    @property
    def on_disk(self) -> bool:
        return self._on_disk

    def append(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.num_rows += batch.num_rows
        if self._on_disk:
            self._write(batch)
            return
        self._held.append(batch)
        self._held_bytes += batch.nbytes
        if self._held_bytes > self.budget_bytes:
            self._on_disk = True
            held, self._held, self._held_bytes = self._held, [], 0
            for b in held:
                self._write(b)

    def _write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = ipc.new_stream(str(self.path), batch.schema)
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        if not self._on_disk:
            yield from self._held
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with pa.OSFile(str(self.path)) as f:
            yield from ipc.open_stream(f)

    def map(self, fn: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        """Replace every batch held by ``fn(batch)`` (a column's type widened: ``bucketed._read``'s ids)."""
        if not self._on_disk:
            self._held = [fn(b) for b in self._held]
            self._held_bytes = sum(b.nbytes for b in self._held)
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        old = self.path.with_name(self.path.name + ".old")
        self.path.rename(old)
        with pa.OSFile(str(old)) as f:
            for batch in ipc.open_stream(f):
                self._write(fn(batch))
        old.unlink()

    def table(self) -> pa.Table | None:
        """Every batch as one table (None when empty)."""
        batches = list(self.batches())
        return pa.Table.from_batches(batches) if batches else None

    def replace(self, table: pa.Table) -> None:
        """Make ``table`` the store's whole content (a bucket after its duplicates went)."""
        self.clear()
        for batch in table.to_batches():
            self.append(batch)

    def clear(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.path.unlink(missing_ok=True)
        self._held, self._held_bytes, self._on_disk, self.num_rows = [], 0, False, 0
