"""How a global batch is divided among ranks, and an epoch into global batches."""

from __future__ import annotations

import numpy as np


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, exactly (no float)."""
    return -(-a // b)


def rank_shares(global_size: int, world_size: int) -> list[int]:
    """Rows of each rank in a global batch of ``global_size``: equal, the first ranks one more
    when it does not divide (np.array_split's rule). Example: 7 rows, 3 ranks -> [3, 2, 2]."""
    base, extra = divmod(global_size, world_size)
    return [base + (r < extra) for r in range(world_size)]


def batch_bounds(num_rows: int, global_batch_size: int, world_size: int) -> np.ndarray:
    """Start offsets of every global batch, plus ``num_rows`` at the end.

    Every row is in exactly one batch. The last batch holds the remainder; if that would give
    some rank no row at all (fewer rows than ranks), it is merged into the batch before.
    Example: 10 rows, batches of 4, 3 ranks -> [0, 4, 10] (the last 2 rows join batch 1).
    """
    bounds = list(range(0, num_rows, global_batch_size)) + [num_rows]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < world_size:
        del bounds[-2]
    return np.asarray(bounds, dtype=np.int64)
