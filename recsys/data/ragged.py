"""Vectorised gathers over ragged (CSR-like) arrays: no per-example Python loops.

Each works on numpy arrays and on torch tensors on any device alike (recsys/data/arrays.py), returning the kind
it was given; int64 lengths.
"""

from __future__ import annotations

from recsys.data import arrays
from recsys.data.arrays import Array


def gather_ranges(starts: Array, ends: Array, values: Array) -> tuple[Array, Array]:
    """Concatenate ``values[starts[j]:ends[j]]`` for every j.

    Returns (lengths ``n``, concatenated values). Example: starts [0, 3], ends [2, 4] over
    values [a b c d] -> lengths [2, 1], values [a b d]. On an accelerator the values' count is read back to size
    the result: one wait for the device's queue of this stream.
    """
    lengths = arrays.as_int64(ends - starts)
    num = arrays.total(lengths)
    before = arrays.cumsum(lengths) - lengths
    index = arrays.repeat(starts - before, lengths, num) + arrays.arange(num, like=lengths)
    return lengths, arrays.take(values, index)


def gather_rows(indptr: Array, values: Array, rows: Array) -> tuple[Array, Array]:
    """Rows of a CSR matrix, concatenated: (lengths per row, values)."""
    return gather_ranges(arrays.take(indptr, rows), arrays.take(indptr, rows + 1), values)


def segment_sum(lengths_inner: Array, lengths_outer: Array) -> Array:
    """Sum consecutive runs of ``lengths_inner``, run j having ``lengths_outer[j]`` entries."""
    if len(lengths_outer) == 0:
        return arrays.zeros(0, like=lengths_outer)
    csum = arrays.concat([arrays.zeros(1, like=lengths_inner), arrays.cumsum(lengths_inner)])
    ends = arrays.cumsum(lengths_outer)
    return csum[ends] - csum[ends - lengths_outer]
