"""EASE's memory and time plan: how much one fit holds at its peak, which dtype fits the memory available, and
how long one λ's O(I³) factorisation takes on this machine (recsys/rankers/ease/solve.py's fit and scoring)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from recsys.rankers.ease.solve import GRAM_BLOCK, gram_dtype

# Share of the available memory a plan may use: MemAvailable is an estimate, and Python, the
# allocator and the rest of the report need some room.
USABLE_MEMORY_SHARE = 0.9
GB = 1e9


def available_memory_bytes(device: str | torch.device = "cpu") -> int | None:
    """Bytes that can be allocated now: free memory of the current CUDA device, or on CPU Linux's
    MemAvailable (/proc/meminfo; psutil is not a dependency). None where neither can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    except OSError:
        pass
    return None


def ease_peak_bytes(num_items: int, dtype: torch.dtype, *, num_users: int, chunk_size: int = 4096) -> int:
    """Estimated peak bytes of the report's EASE (G, λ sweep, scoring) with the inverse in ``dtype``.

    The λ sweep is the peak: G [I, I] (float32, see ``gram_dtype``) + A [I, I] of ``dtype`` + B's
    float32 copy [I, I] when A is float64, + the scoring buffers of ``ease_topk`` (score chunk, dense
    history chunk, top-k temporaries: ~3 x chunk_size x I float32). ``gram_matrix`` needs G +
    [U, GRAM_BLOCK] float32 + [I, GRAM_BLOCK] float32 (and its copy when G is not float32), which
    the sweep exceeds unless U is large, so G + the larger of the two is returned. The sparse copy
    of X (~12 bytes per pair) is left to the headroom of ``USABLE_MEMORY_SHARE``.
    """
    i2 = num_items * num_items
    gram = i2 * gram_dtype(num_users, dtype).itemsize
    inverse = i2 * dtype.itemsize + (i2 * 4 if dtype.itemsize > 4 else 0)
    scoring = 3 * min(chunk_size, max(num_users, 1)) * num_items * 4
    block = min(GRAM_BLOCK, num_items)
    building = num_users * block * 4 + num_items * block * (
        4 + (gram_dtype(num_users, dtype).itemsize if num_users >= 2**24 else 0)
    )
    return int(gram + max(inverse + scoring, building))


@dataclass(frozen=True)
class EasePlan:
    """``plan_ease``'s choice: the dtype to run in, or None when nothing fits (``skipped`` says why)."""

    dtype: torch.dtype | None
    peak_bytes: int  # estimated peak of the chosen dtype (of the cheapest one when skipped)
    available_bytes: int | None  # None: could not be measured
    skipped: str = ""

    def describe(self) -> dict:
        """JSON-able summary for the report."""
        return {
            "dtype": None if self.dtype is None else str(self.dtype).removeprefix("torch."),
            "peak_memory_gb_estimate": round(self.peak_bytes / GB, 2),
            "available_memory_gb": None if self.available_bytes is None else round(self.available_bytes / GB, 2),
        }


PROBE_ITEMS = 2048  # the factorisation timed to estimate a catalogue's: large enough for LAPACK's blocked kernels


def factorisation_seconds(num_items: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> float:
    """Estimated seconds of one λ (Cholesky of G + λI and its inverse, O(I³)) for ``num_items`` on
    this machine now: one probe of ``PROBE_ITEMS`` timed and scaled by (I / probe)³ (the kernels'
    efficiency grows a little with size, so large catalogues come out somewhat pessimistic)."""
    n = min(num_items, PROBE_ITEMS)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n + 64, n, generator=gen).to(device=device, dtype=dtype)
    a = x.T @ x
    a.diagonal().add_(1.0)
    start = time.perf_counter()
    a_cm = a.mT
    torch.linalg.cholesky_ex(a_cm, out=(a_cm, torch.empty((), dtype=torch.int32, device=a.device)))
    torch.cholesky_inverse(a_cm, out=a_cm)
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)
    return (time.perf_counter() - start) * (num_items / n) ** 3


def plan_ease(
    num_items: int,
    num_users: int,
    available_bytes: int | None,
    *,
    chunk_size: int = 4096,
    dtypes: Sequence[torch.dtype] = (torch.float64, torch.float32),
    usable_share: float = USABLE_MEMORY_SHARE,
) -> EasePlan:
    """The first of ``dtypes`` whose ``ease_peak_bytes`` fits in ``usable_share`` of ``available_bytes``.

    Args:
        num_items / num_users: I and U of the training matrix.
        available_bytes: from ``available_memory_bytes`` (a parameter so tests can pose any
            budget); None (unknown) takes the first dtype, as before plans existed.
        dtypes: in order of preference (float64 is Steck's; float32 halves the matrices).

    Returns:
        ``EasePlan``; when none fits, ``dtype`` is None and ``skipped`` reads
        "needs N GB, have M GB (...)".
    """
    if not dtypes:
        raise ValueError("dtypes must not be empty")
    peaks = {dtype: ease_peak_bytes(num_items, dtype, num_users=num_users, chunk_size=chunk_size) for dtype in dtypes}
    if available_bytes is None:
        return EasePlan(dtypes[0], peaks[dtypes[0]], None)
    for dtype in dtypes:
        if peaks[dtype] <= usable_share * available_bytes:
            return EasePlan(dtype, peaks[dtype], int(available_bytes))
    cheapest = min(peaks, key=peaks.get)
    need = peaks[cheapest]
    return EasePlan(
        None, need, int(available_bytes),
        skipped=(
            f"needs {need / GB:.1f} GB, have {available_bytes / GB:.1f} GB ({str(cheapest).removeprefix('torch.')} inverse "
            f"of {num_items:,} items; {usable_share:.0%} of the available memory may be used)"
        ),
    )  # fmt: skip
