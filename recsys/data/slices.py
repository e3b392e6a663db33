"""A time-ordered log replayed as daily slices (data.slices, data.slice, data.slice_window).

Every row of the dataset dir (train, valid and test alike: the protocol's split is not used) falls in one of
``slices`` equal windows of the log's time range::

    bounds[k] = t_min + ceil(k * (t_max - t_min + 1) / slices)       window k = [bounds[k], bounds[k + 1])

A run with ``data.slice = K`` sees::

    train  every row of windows 0..K: the users' histories, profile bags and the items test masks;
           training examples only the rows of windows K - slice_window + 1 .. K (slice_window=1: window K alone,
           an incremental run; 0: every window so far, retraining from scratch)
    valid  empty (nothing held out: the run trains trainer.epochs epochs, data.train_on_valid=true)
    test   the rows of window K + 1: "train on day t, test on day t + 1"

Windows are cut from one log, so two of them never overlap; a warm start from a run trained on a later (or the
same) window is refused by recsys/rundir/continuous.py, naming both ranges.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from data_pipelines.errors import DatasetError
from recsys.data.dataset import Interactions, RetrievalData


def slice_bounds(timestamps: np.ndarray, slices: int) -> np.ndarray:
    """``slices + 1`` window bounds over the range of ``timestamps`` (the last bound is past the latest time)."""
    t_min, t_max = int(timestamps.min()), int(timestamps.max())
    span = t_max - t_min + 1
    return np.array([t_min - (-(k * span) // slices) for k in range(slices + 1)], dtype=np.int64)


def all_rows(data: RetrievalData) -> Interactions:
    splits = data.splits
    return Interactions.concat(Interactions.concat(splits["train"], splits["valid"]), splits["test"])


def _rows_in(rows: Interactions, lo: int, hi: int) -> Interactions:
    keep = (rows.timestamps >= lo) & (rows.timestamps < hi)
    return Interactions(rows.user_ids[keep], rows.item_ids[keep], rows.timestamps[keep])


def with_slice(data: RetrievalData, slices: int, k: int, window: int = 1) -> RetrievalData:
    """``data`` re-split as slice ``k`` of ``slices`` (module docstring); refuses a window with no rows."""
    rows = all_rows(data)
    if len(rows) == 0:
        raise DatasetError(f"{data.dir}: data.slices={slices}: the dataset has no rows to slice")
    bounds = slice_bounds(rows.timestamps, slices)
    first = 0 if window == 0 else max(0, k - window + 1)
    train = _rows_in(rows, int(bounds[0]), int(bounds[k + 1]))
    test = _rows_in(rows, int(bounds[k + 1]), int(bounds[k + 2]))
    examples = int(np.count_nonzero(train.timestamps >= bounds[first]))
    for what, index, count in (("trained on", k, examples), ("tested on", k + 1, len(test))):
        if count == 0:
            raise DatasetError(
                f"data.slice={k}: slice {index} of data.slices={slices} (times [{bounds[index]}, {bounds[index + 1]}) "
                f"of the log's [{bounds[0]}, {bounds[-1]})), {what} by this run, has no rows; choose another "
                "data.slice or fewer data.slices"
            )
    empty = Interactions(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    counts = {"train": len(train), "valid": 0, "test": len(test)}
    meta = {**data.meta, "counts": counts, "slice": {"slices": slices, "slice": k, "bounds": bounds.tolist()}}
    return replace(
        data,
        meta=meta,
        splits={"train": train, "valid": empty, "test": test},
        example_since=int(bounds[first]),
        slice_bounds=bounds,
    )


def slice_range(bounds: np.ndarray, k: int, window: int = 1) -> tuple[int, int]:
    """[first, last) times of the training examples of slice ``k`` (``window`` as data.slice_window)."""
    first = 0 if window == 0 else max(0, k - window + 1)
    return int(bounds[first]), int(bounds[k + 1])
