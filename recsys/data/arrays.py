"""The few array operations whose spelling differs between numpy and torch, for code written once over both.

The batch builders (recsys/data/ragged.py, row_sources.py, batches.py) run on numpy arrays on the host (the host
loader, evaluation, serving) and on torch tensors on the training device (the device loader). Indexing,
arithmetic, ``.clip``, ``.min`` / ``.max``, ``.reshape`` and ``len`` read the same in both; what does not is here,
each function taking a ``like`` array whose kind (and device) its result has. Integer results are int64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

Array = np.ndarray | torch.Tensor


def is_tensor(x: Array) -> bool:
    return isinstance(x, torch.Tensor)


# A loader whose device is the CPU keeps numpy arrays: they are the host's own memory, and numpy's kernels beat
# torch's per-op overhead on the small per-batch arrays (scripts/bench_loader.py). Tests set it True to run on CPU
# the torch ops an accelerator runs.
TORCH_ON_CPU = False


def arange(n: int, like: Array) -> Array:
    return torch.arange(n, device=like.device) if is_tensor(like) else np.arange(n, dtype=np.int64)


def zeros(n: int, like: Array) -> Array:
    return torch.zeros(n, dtype=torch.int64, device=like.device) if is_tensor(like) else np.zeros(n, dtype=np.int64)


def ones(n: int, like: Array) -> Array:
    return torch.ones(n, dtype=torch.int64, device=like.device) if is_tensor(like) else np.ones(n, dtype=np.int64)


def as_int64(x: Array) -> Array:
    return x.to(torch.int64) if is_tensor(x) else x.astype(np.int64, copy=False)


def concat(parts: Sequence[Array]) -> Array:
    return torch.cat(list(parts)) if is_tensor(parts[0]) else np.concatenate(parts)


def cumsum(x: Array) -> Array:
    return torch.cumsum(x, 0) if is_tensor(x) else np.cumsum(x, dtype=np.int64)


def total(lengths: Array) -> int:
    """The sum of ``lengths`` as a Python int (on an accelerator: a wait for the work that computes them)."""
    return int(lengths.sum())


def repeat(values: Array, counts: Array, num: int) -> Array:
    """Each ``values[j]`` ``counts[j]`` times; ``num`` = counts' sum (torch then needs no host sync to size it)."""
    if is_tensor(values):
        return torch.repeat_interleave(values, counts, output_size=num)
    return np.repeat(values, counts)


def take(values: Array, index: Array) -> Array:
    """``values[index]`` of a 1-d array (torch: index_select, faster than advanced indexing on CPU)."""
    return torch.index_select(values, 0, index) if is_tensor(values) else values[index]


def interleave(a: Array, b: Array) -> Array:
    """[a0, b0, a1, b1, ...]."""
    return torch.stack([a, b], dim=1).reshape(-1) if is_tensor(a) else np.stack([a, b], axis=1).reshape(-1)


def floor_scaled(x: Array, factor: float) -> Array:
    """floor(factor * x) of an integer array, as int64, in float64 on both (torch's default float32 would round
    7 * 0.7 down to 6)."""
    if is_tensor(x):
        return torch.floor(x.to(torch.float64) * factor).to(torch.int64)
    return np.floor(factor * x).astype(np.int64)


def to_tensor(x: Array, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``x`` as a contiguous torch tensor of ``dtype`` (a numpy array's memory shared where the dtype matches)."""
    t = x if is_tensor(x) else torch.from_numpy(np.ascontiguousarray(x))
    return t.to(dtype).contiguous()


def on_device(x: np.ndarray | None, device: torch.device) -> Array | None:
    """A host array copied to ``device`` as a tensor of its own dtype; on the CPU the array itself (``TORCH_ON_CPU``:
    a tensor sharing its memory). None stays None."""
    if x is None or (device.type == "cpu" and not TORCH_ON_CPU):
        return x
    host = np.ascontiguousarray(x)
    return torch.from_numpy(host if host.flags.writeable else host.copy()).to(device)


def minimum(a: Array, b: Array) -> Array:
    return torch.minimum(a, b) if is_tensor(a) else np.minimum(a, b)


def maximum(a: Array, b: Array) -> Array:
    return torch.maximum(a, b) if is_tensor(a) else np.maximum(a, b)
