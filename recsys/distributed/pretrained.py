"""Initialise a sharded table from a file of pretrained vectors.

Accepted files (``model.tables.<name>.pretrained_path``):

- ``.npy``: a float array of shape (num_rows, dim); memory-mapped, so each rank reads only the
  rows of its shards.
- ``.parquet``: columns ``id`` (int64 row index, every row exactly once) and ``vector``
  (list<float> of length dim).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

RowReader = Callable[[int, int], np.ndarray]  # (first row, end row) -> rows x dim


def open_pretrained(path: str | Path, *, table: str, num_rows: int, dim: int) -> RowReader:
    path = Path(path)
    where = f"model.tables.{table}.pretrained_path={str(path)!r}"
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no such file")
    if path.suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)  # a pickle is refused, never run
        except ValueError as e:
            raise ValueError(f"{where}: not a readable .npy file ({e})") from None
        if array.shape != (num_rows, dim):
            raise ValueError(f"{where}: shape {array.shape}, expected ({num_rows}, {dim}) for table '{table}'")
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"{where}: dtype {array.dtype}, expected a float type")
        # np.array copies this rank's rows out of the read-only memory map: torch.from_numpy on a read-only
        # array warns that writing to the tensor is undefined behaviour
        return _finite(lambda lo, hi: np.array(array[lo:hi], dtype=np.float32), where)  # each rank checks its rows
    if path.suffix == ".parquet":
        frame = pq.read_table(path)
        for column in ("id", "vector"):
            if column not in frame.column_names:
                raise ValueError(f"{where}: no column '{column}' (columns: {frame.column_names})")
        ids = frame.column("id").to_numpy()
        vectors = frame.column("vector").combine_chunks()
        lengths = np.diff(vectors.offsets.to_numpy())
        bad = np.nonzero(lengths != dim)[0]
        if bad.size:
            raise ValueError(
                f"{where}: id {int(ids[bad[0]])} has a vector of length {int(lengths[bad[0]])}, expected {dim}"
            )
        out_of_range = ids[(ids < 0) | (ids >= num_rows)]
        if out_of_range.size:
            raise ValueError(f"{where}: id {int(out_of_range[0])} outside table '{table}' of {num_rows} rows")
        counts = np.bincount(ids, minlength=num_rows)
        if (counts > 1).any():
            raise ValueError(f"{where}: id {int(np.argmax(counts > 1))} appears {int(counts.max())} times")
        if (counts == 0).any():
            missing = np.nonzero(counts == 0)[0]
            raise ValueError(f"{where}: {missing.size} of {num_rows} ids missing, e.g. id {int(missing[0])}")
        matrix = np.empty((num_rows, dim), dtype=np.float32)
        matrix[ids] = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        _finite(lambda lo, hi: matrix[lo:hi], where)(0, num_rows)
        return lambda lo, hi: matrix[lo:hi]
    raise ValueError(f"{where}: unknown format; use .npy or .parquet")


def _finite(read_rows: RowReader, where: str) -> RowReader:
    """``read_rows`` that refuses a NaN or infinite value (it would train to a NaN loss), naming its row and column."""

    def checked(lo: int, hi: int) -> np.ndarray:
        rows = read_rows(lo, hi)
        bad = np.argwhere(~np.isfinite(rows))
        if bad.size:
            r, c = (int(x) for x in bad[0])
            raise ValueError(f"{where}: row {lo + r}, column {c} is {rows[r, c]}; vectors must be finite")
        return rows

    return checked


@torch.no_grad()
def load_pretrained_table(module: nn.Module, table: str, read_rows: RowReader) -> None:
    """Copy the file's rows into this rank's shards of ``table`` (any sharding type)."""
    found = False
    for key, value in module.state_dict().items():
        if not key.endswith(f".embedding_bags.{table}.weight"):
            continue
        found = True
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                row0, col0 = shard.metadata.shard_offsets
                rows, cols = shard.tensor.shape
                shard.tensor.copy_(torch.from_numpy(read_rows(row0, row0 + rows)[:, col0 : col0 + cols]))
        else:
            value.copy_(torch.from_numpy(read_rows(0, value.shape[0])))
    if not found:
        raise KeyError(f"no embedding table named '{table}' in the model")
