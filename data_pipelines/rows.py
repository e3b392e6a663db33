"""Row numbers: a frame's rows ordered and selected as integer arrays, its columns copied once, at the end.

Sorts are ``lexsort_fast``: keys packed into one uint64 whose values are sorted (not argsorted). The
canonical order takes two such sorts, by (user_id, item_id) (a no-op on MovieLens files, which
come in that order) and then a stable one by (user_id, timestamp); recbole's split adds one
more, by (user_id, random draw).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["compose", "lexsort_fast", "lexsort_order", "run_starts", "take_rows"]


def lexsort_fast(keys: tuple[np.ndarray, ...], *, truncate_last: bool = False) -> np.ndarray:
    """Exactly ``np.lexsort(keys)`` (the LAST key is primary, stable), often 10-40x faster.

    Integer keys are shifted to start at 0 and packed into one uint64 (primary key in the
    high bits) with a tie-breaker in the low bits: the row index, or, when the primary key
    is already in runs (sorted), the row's position within its run. Sorting those values
    (not an argsort) then gives the stable order directly. When the keys and the
    tie-breaker need more than 64 bits, ``truncate_last`` lets the least significant key
    (``keys[0]``, e.g. uniform random draws as integers) lose low bits; rows whose
    truncated keys tie are then re-sorted exactly, so the result is still ``np.lexsort``'s.
    Otherwise it falls back to an argsort of the packed keys, or to ``np.lexsort``.
    """
    order = lexsort_order(keys, truncate_last=truncate_last)
    return np.arange(len(keys[0]), dtype=np.int64) if order is None else order


def _as_uint64(k: np.ndarray) -> np.ndarray:
    """``k``'s values mod 2^64 (two's complement), a view when it is 64-bit already."""
    return k.view(np.uint64) if k.dtype.itemsize == 8 else k.astype(np.uint64)


def _pack(columns: list[np.ndarray], los: list[int], bits: list[int], drop_low: int = 0) -> np.ndarray:
    """One uint64 per row: each column minus its minimum ``lo`` (< 2**bits), primary (first) in the high
    bits; the last column loses its ``drop_low`` lowest bits."""
    packed, tmp = np.empty(len(columns[0]), dtype=np.uint64), None
    for j, (k, lo, b) in enumerate(zip(columns, los, bits)):
        out = packed if j == 0 else tmp
        out = np.subtract(_as_uint64(k), np.uint64(lo % 2**64), out=out)
        if j == len(columns) - 1 and drop_low:
            out >>= np.uint64(drop_low)
        if j:
            packed <<= np.uint64(b)
            packed |= out
        tmp = out if j else None
    return packed


def _is_sorted(columns: list[np.ndarray]) -> bool:
    """Whether rows are in lexicographic order of ``columns`` (primary first), ties allowed."""
    tied = None
    for k in columns:
        a, b = k[:-1], k[1:]
        down = b < a
        if tied is not None:
            down &= tied
        if down.any():
            return False
        tied = (b == a) if tied is None else (tied & (b == a))
        if not tied.any():
            break
    return True


def run_starts(sorted_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of equal values in ``sorted_ids`` (non-empty)."""
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    return starts, np.diff(np.r_[starts, len(sorted_ids)])


def lexsort_order(keys: tuple[np.ndarray, ...], *, truncate_last: bool = False) -> np.ndarray | None:
    """``lexsort_fast(keys)``, or None when that is the identity (the rows are already in order).

    None lets a caller skip copying its columns; the check costs one pass when the keys pack
    into 64 bits (MovieLens files and every split this module returns are sorted already).
    """
    keys = tuple(np.asarray(k) for k in keys)
    n = len(keys[0])
    if n <= 1:
        return None
    if not all(np.issubdtype(k.dtype, np.integer) for k in keys):
        order = np.lexsort(keys)
        return None if np.array_equal(order, np.arange(n)) else order
    columns = list(reversed(keys))  # primary first
    los = [int(k.min()) for k in columns]
    bits = [max((int(k.max()) - lo).bit_length(), 1) for k, lo in zip(columns, los)]
    total = sum(bits)
    packed = None
    if total <= 64:
        packed = _pack(columns, los, bits)
        if (packed[1:] >= packed[:-1]).all():
            return None
    elif _is_sorted(columns):
        return None
    # tie-breaker: the row index, or the position within the primary key's runs when those are fewer bits
    tie_bits = (n - 1).bit_length()
    run_start_of_row = None
    if total + tie_bits > 64 and len(columns) > 1 and (columns[0][1:] >= columns[0][:-1]).all():
        starts, lengths = run_starts(columns[0])
        pos_bits = (int(lengths.max()) - 1).bit_length()
        if pos_bits < tie_bits:
            tie_bits, run_start_of_row = pos_bits, np.repeat(starts, lengths)
    truncated = max(total + tie_bits - 64, 0)
    if truncated and (not truncate_last or truncated >= bits[-1]):
        return _lexsort_argsort(keys, packed)
    if truncated:
        packed = _pack(columns, los, bits[:-1] + [bits[-1] - truncated], drop_low=truncated)
    packed <<= np.uint64(tie_bits)
    tie = np.arange(n, dtype=np.int64)
    if run_start_of_row is not None:
        tie -= run_start_of_row
    packed |= tie.view(np.uint64)
    del tie
    packed.sort()
    tied = None
    if truncated:  # rows equal but for the truncated bits are in index order: fixed below
        high = packed >> np.uint64(tie_bits)
        tied = high[1:] == high[:-1]
        del high
    packed &= np.uint64((1 << tie_bits) - 1)
    order = packed.view(np.int64)
    if run_start_of_row is not None:
        order += run_start_of_row  # the sorted rows keep the primary's runs where they were
    if tied is not None and tied.any():  # order those by the full last key, then index
        at = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])
        group = np.cumsum(np.r_[True, ~tied][at])
        rows = order[at]
        order[at] = rows[np.lexsort((rows, keys[0][rows], group))]
    return order


def _lexsort_argsort(keys: tuple[np.ndarray, ...], packed: np.ndarray | None) -> np.ndarray:
    """np.lexsort(keys) via an argsort of the packed keys (no room for a tie-breaker), or np.lexsort itself."""
    if packed is None:
        return np.lexsort(keys)
    order = np.argsort(packed)
    sorted_packed = packed[order]
    if (sorted_packed[1:] == sorted_packed[:-1]).any():
        return np.argsort(packed, kind="stable")
    return order


def compose(order: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
    """Rows (of the original frame) that ``mask`` selects from the rows ``order`` lists; None = all, in order."""
    if order is None:
        return None if mask.all() else np.flatnonzero(mask)
    return np.compress(mask, order)  # np.compress: several times faster than order[mask]


def take_rows(df: pd.DataFrame, rows: np.ndarray | None) -> pd.DataFrame:
    """``df.iloc[rows]`` (None = every row) with a fresh RangeIndex, one numpy take per column."""
    if rows is None:
        return df.reset_index(drop=True)
    if df.columns.has_duplicates:
        return df.iloc[rows].reset_index(drop=True)
    data = {}
    for c in df.columns:
        s = df[c]
        data[c] = s.to_numpy()[rows] if isinstance(s.dtype, np.dtype) else s.take(rows).reset_index(drop=True)
    return pd.DataFrame(data, columns=df.columns, copy=False)
