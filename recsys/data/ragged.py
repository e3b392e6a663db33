"""Vectorised gathers over ragged (CSR-like) arrays: no per-example Python loops."""

from __future__ import annotations

from typing import Tuple

import numpy as np


def gather_ranges(starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Concatenate ``values[starts[j]:ends[j]]`` for every j.

    Returns (lengths ``n``, concatenated values). Example: starts [0, 3], ends [2, 4] over
    values [a b c d] -> lengths [2, 1], values [a b d].
    """
    lengths = (ends - starts).astype(np.int64)
    total = int(lengths.sum())
    before = np.cumsum(lengths) - lengths
    index = np.repeat(starts - before, lengths) + np.arange(total, dtype=np.int64)
    return lengths, values[index]


def gather_rows(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Rows of a CSR matrix, concatenated: (lengths per row, values)."""
    return gather_ranges(indptr[rows], indptr[rows + 1], values)


def segment_sum(lengths_inner: np.ndarray, lengths_outer: np.ndarray) -> np.ndarray:
    """Sum consecutive runs of ``lengths_inner``, run j having ``lengths_outer[j]`` entries."""
    if lengths_outer.size == 0:
        return np.zeros(0, dtype=np.int64)
    csum = np.concatenate([[0], np.cumsum(lengths_inner, dtype=np.int64)])
    ends = np.cumsum(lengths_outer, dtype=np.int64)
    return csum[ends] - csum[ends - lengths_outer]
