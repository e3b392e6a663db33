"""Id vocabularies built while a log streams past: distinct raw ids (int64 or strings) in ascending
order, index i being the id's contiguous index, and the mapping raw id -> index for later batches.

Memory is O(distinct ids), never O(rows): each batch contributes its distinct ids (and, for users,
their row counts, which size the per-user buckets of ``bucketed``).

Batches of one column may come as int64 and as strings (``log_columns.ids``: a batch of canonical
integers, then one holding "007"): from the first string batch on, the vocabulary is of strings,
the integers so far turned into their decimal text (the same ids: "7" is 7), ascending by code point.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["IdMapper", "VocabBuilder"]

_COMPACT_EVERY = 1 << 22  # distinct ids pending from batches before they are merged (bounds memory)
_DENSE_SLACK = 4  # integer ids spanning <= 4x their count (+ 1M) are mapped by one lookup table


class VocabBuilder:
    """Distinct values of one id column over many batches, with each value's row count.

    Integer ids within a span of at most ``_DENSE_SLACK`` x the rows seen (+ 1M) are counted in
    an array indexed by id (a bincount per batch, ~10x cheaper than hashing); wider ones, and
    strings, by Arrow's hash ``value_counts``, merged every ``_COMPACT_EVERY`` distinct ids.
    """

    def __init__(self) -> None:
        self._values: list[pa.Array] = []
        self._counts: list[np.ndarray] = []
        self._pending = 0  # distinct ids per batch added since the last merge
        self._merged = 0  # distinct ids after the last merge
        self._rows = 0
        self._dense: np.ndarray | None = None  # counts of ids _lo, _lo + 1, ...
        self._lo = 0
        self._hashing = False
        self._strings = False  # the ids seen include text: every value is held as a string

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        self._rows += len(column)
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if text and not self._strings:
            self._to_strings()
        elif self._strings and not text:
            column = pc.cast(column, pa.string())
        if not self._hashing and pa.types.is_integer(column.type) and len(column):
            values = np.asarray(column.to_numpy())
            lo, hi = int(values.min()), int(values.max())
            if self._dense is not None:
                lo, hi = min(lo, self._lo), max(hi, self._lo + len(self._dense) - 1)
            if hi - lo + 1 <= _DENSE_SLACK * self._rows + (1 << 20):
                self._count_dense(values, lo, hi)
                return
            self._to_hashing()
        self._hashing = True
        counted = pc.value_counts(column)
        self._values.append(counted.field("values"))
        self._counts.append(counted.field("counts").to_numpy())
        self._pending += len(counted)
        if self._pending > max(_COMPACT_EVERY, self._merged) and len(self._values) > 1:
            self._merge()  # once the new ids outnumber the merged ones: O(rows) merging in all

    def _count_dense(self, values: np.ndarray, lo: int, hi: int) -> None:
        if self._dense is None or lo < self._lo or hi >= self._lo + len(self._dense):
            grown = np.zeros(hi - lo + 1, np.int64)
            if self._dense is not None:
                grown[self._lo - lo : self._lo - lo + len(self._dense)] = self._dense
            self._dense, self._lo = grown, lo
        batch_lo = int(values.min())
        counts = np.bincount(values - batch_lo)
        self._dense[batch_lo - self._lo : batch_lo - self._lo + len(counts)] += counts

    def _to_hashing(self) -> None:
        """Switch to hashing (the ids turned out too sparse), keeping the counts so far."""
        self._hashing = True
        if self._dense is not None:
            present = np.flatnonzero(self._dense)
            self._values.append(pa.array(present + self._lo))
            self._counts.append(self._dense[present])
            self._pending += len(present)
            self._dense = None

    def _to_strings(self) -> None:
        """Hold every id as text from now on: the integers counted so far become their decimal text."""
        self._to_hashing()
        self._values = [pc.cast(v, pa.string()) for v in self._values]
        self._strings = True

    def _merge(self) -> None:
        values, counts = self._values, self._counts
        if len(values) > 1:
            table = pa.table({"v": pa.concat_arrays(values), "n": np.concatenate(counts)})
            merged = table.group_by("v", use_threads=False).aggregate([("n", "sum")])
            values, counts = [merged["v"].combine_chunks()], [merged["n_sum"].to_numpy()]
        self._values, self._counts, self._pending = values, counts, 0
        self._merged = len(values[0]) if values else 0

    def finish(self) -> tuple[pa.Array, np.ndarray]:
        """(distinct values ascending, row count of each)."""
        if self._dense is not None:
            present = np.flatnonzero(self._dense)
            return pa.array(present + self._lo), self._dense[present]
        self._merge()
        if not self._values:
            return pa.array([], pa.string() if self._strings else pa.int64()), np.zeros(0, np.int64)
        values, counts = self._values[0], self._counts[0]
        order = pc.array_sort_indices(values)
        return values.take(order), counts[order.to_numpy()]


class IdMapper:
    """Raw id -> contiguous index in a sorted vocabulary (-1 where absent).

    Integer ids in a dense range go through one lookup table (a gather per row); other integers
    through a pandas hash index built once; strings through Arrow's ``index_in`` (which hashes the
    vocabulary on each call: strings cost more per batch).
    """

    def __init__(self, vocab: pa.Array) -> None:
        self.vocab = vocab
        self._table = None
        self._index = None
        if pa.types.is_integer(vocab.type) and len(vocab):
            values = vocab.to_numpy()
            self._lo = int(values[0])
            span = int(values[-1]) - self._lo + 1
            if span <= _DENSE_SLACK * len(values) + (1 << 20):
                self._table = np.full(span, -1, dtype=np.int64)
                self._table[values - self._lo] = np.arange(len(values), dtype=np.int64)
            else:
                self._index = pd.Index(values)

    def __call__(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        if pa.types.is_integer(column.type) and not pa.types.is_integer(self.vocab.type):
            column = pc.cast(column, self.vocab.type)  # an integer id is its decimal text (log_columns.ids)
        if self._table is not None:
            values = np.asarray(column.to_numpy()) - self._lo
            inside = (values >= 0) & (values < len(self._table))
            if inside.all():
                return self._table[values]
            return np.where(inside, self._table[np.where(inside, values, 0)], -1)
        if self._index is not None:
            return self._index.get_indexer(np.asarray(column.to_numpy())).astype(np.int64, copy=False)
        return np.asarray(pc.fill_null(pc.index_in(column, value_set=self.vocab), -1).to_numpy()).astype(np.int64)
