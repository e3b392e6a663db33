"""``chunked_topk`` on an accelerator: the seen items masked and the top k taken on the device, no host sync a chunk.

The host path (``retrieval.chunked_topk`` on CPU) builds each chunk's mask on the host and decides the tie fix-ups
as it goes (``nonzero``): on a GPU each of those stops the stream until the host has caught up. Here, per chunk of
query rows:

    mask        the chunk's slice of the exclusion CSR's item ids, one asynchronous copy from page-locked memory
                (on a side stream, overlapping the chunk's matmul), rows expanded on the device from the CSR's
                indptr (copied once), scattered into the score block as -inf
    candidates  the k + 1 best of each row (``top_candidates``: torch.topk over the row's best groups)
    ties        whether any row needs the tie rule's fix-ups: two counts copied to page-locked memory

Two score buffers alternate, so the host reads chunk j's counts (waiting on chunk j's event, not on the stream)
while chunk j + 1 is queued behind it; only a chunk with a tie at its k-th score or inside its top k runs the host
path's fix-ups. The result equals the host path's to the last id (tests/ranking/test_retrieval.py runs this path on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.topk_ties import apply_tie_rule, pad_topk
from recsys.utils import progress

# Candidates by groups (top_candidates): a row of I scores is cut into groups of GROUP; the n best groups by their
# maximum hold the row's n best scores, so torch.topk reads n * GROUP scores instead of I after one max pass.
GROUP = 32
MIN_GROUPS_PER_CANDIDATE = (
    4  # rows shorter than 4 * n * GROUP: the gather saves too little, torch.topk takes them whole
)


def top_candidates(scores: torch.Tensor, n: int, by_groups: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The n best scores of each row of ``scores`` [C, I] and their column ids, [C, n] each, sorted descending.

    Which of several items tied at the n-th score is returned is arbitrary (the caller's tie rule rescans those
    rows). By groups: the n-th best group maximum is at most the row's n-th best score, so every score above it lies
    in one of the n best groups, and the n best groups hold n scores at least that high: the top n of their columns
    has the row's top-n values exactly.
    """
    num_rows, num_items = scores.shape
    if not by_groups or num_items < MIN_GROUPS_PER_CANDIDATE * n * GROUP:
        return torch.topk(scores, n, dim=1, largest=True, sorted=True)
    full = num_items // GROUP * GROUP
    maxima = scores[:, :full].reshape(num_rows, full // GROUP, GROUP).amax(dim=2)  # a view of a row-major block
    if full < num_items:  # the last, shorter group
        maxima = torch.cat([maxima, scores[:, full:].amax(dim=1, keepdim=True)], dim=1)
    groups = torch.topk(maxima, n, dim=1, sorted=False).indices  # [C, n]
    cols = (groups.unsqueeze(2) * GROUP + torch.arange(GROUP, device=scores.device)).view(num_rows, n * GROUP)
    beyond = cols >= num_items  # the last group's slots past the row's end
    cols = cols.clamp_max(num_items - 1)
    values = torch.gather(scores, 1, cols).masked_fill_(beyond, float("-inf"))
    vals, picked = torch.topk(values, n, dim=1, largest=True, sorted=True)
    return vals, torch.gather(cols, 1, picked)


class DeviceExclusions:
    """An exclusion CSR applied to score blocks on ``device``: its indptr there once, each block's item ids copied
    there as the block is scored (int32, from page-locked memory on CUDA, on a side stream)."""

    def __init__(self, exclude: UserItemCSR, device: torch.device):
        self.exclude, self.device = exclude, device
        self.cuda = device.type == "cuda"
        indptr = torch.from_numpy(exclude.indptr)
        self.indptr = (indptr.pin_memory() if self.cuda else indptr).to(device, non_blocking=True)
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        # made by a fill on the device: torch.tensor(-inf, device=...) would copy from the host and wait for the stream
        self.minus_inf = torch.full((), float("-inf"), device=device)

    def mask(self, scores: torch.Tensor, start: int, stop: int) -> None:
        """``scores[u - start, i] = -inf`` in place for every excluded (u, i) with start <= u < stop."""
        lo, hi = int(self.exclude.indptr[start]), int(self.exclude.indptr[stop])
        if hi == lo:
            return
        cols = self._item_ids(lo, hi)
        lengths = self.indptr[start + 1 : stop + 1] - self.indptr[start:stop]
        rows = torch.repeat_interleave(torch.arange(stop - start, device=self.device), lengths, output_size=hi - lo)
        scores.index_put_((rows, cols), self.minus_inf)

    def _item_ids(self, lo: int, hi: int) -> torch.Tensor:
        ids = self.exclude.indices[lo:hi]
        if not self.cuda:
            return torch.from_numpy(ids.astype(np.int32)).to(self.device)
        staged = torch.empty(hi - lo, dtype=torch.int32, pin_memory=True)  # freed only once its copy has run
        np.copyto(staged.numpy(), ids, casting="unsafe")  # ids < num_items < 2**31
        main = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            cols = staged.to(self.device, non_blocking=True)
        main.wait_stream(self.copy_stream)
        cols.record_stream(main)
        return cols


@dataclass
class _Chunk:
    """A chunk's top candidates on the device, and its two tie counts on their way to the host."""

    start: int
    stop: int
    scores: torch.Tensor  # [C, I], masked; kept until its fix-ups are decided
    vals: torch.Tensor  # [C, min(k + 1, I)], descending
    ids: torch.Tensor
    counts: torch.Tensor  # [2] on the host: rows tied at the k-th score, rows tied inside the top k
    done: torch.cuda.Event | None  # recorded after the counts' copy (CUDA)


def device_chunked_topk(
    score_chunk, num_queries: int, num_items: int, k: int, *, exclude, chunk_size: int, device, by_groups: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``retrieval.chunked_topk``'s contract (its arguments; its results to the last id), computed as described
    above; runs on any device (CPU in the tests). ``by_groups=False``: torch.topk over whole rows (the bench's
    side-by-side)."""
    device = torch.device(device)
    out_scores = torch.full((num_queries, k), float("-inf"), dtype=torch.float32, device=device)
    out_ids = torch.full((num_queries, k), -1, dtype=torch.int64, device=device)
    if num_items == 0 or num_queries == 0:
        return out_scores, out_ids
    exclusions = DeviceExclusions(exclude, device) if exclude is not None else None
    size = min(chunk_size, num_queries)
    buffers = [torch.empty(size, num_items, dtype=torch.float32, device=device) for _ in range(2)]
    pending: _Chunk | None = None
    for j, start in enumerate(range(0, num_queries, chunk_size)):
        stop = min(start + chunk_size, num_queries)
        scores = score_chunk(start, stop, buffers[j % 2][: stop - start])
        if exclusions is not None:
            exclusions.mask(scores, start, stop)
        chunk = _launch_candidates(scores, k, start, stop, by_groups)
        if pending is not None:  # chunk j - 1, while chunk j is queued behind it
            _finish(pending, k, out_scores, out_ids)
            progress.advance(pending.stop - pending.start)
        pending = chunk
    _finish(pending, k, out_scores, out_ids)
    progress.advance(pending.stop - pending.start)
    return out_scores, out_ids


def _launch_candidates(scores: torch.Tensor, k: int, start: int, stop: int, by_groups: bool) -> _Chunk:
    """Queues a chunk's candidates and tie counts; returns without waiting for them."""
    vals, ids = top_candidates(scores, min(k + 1, scores.shape[1]), by_groups)
    top = vals[:, :k]
    inside = (top[:, 1:] == top[:, :-1]).any(dim=1).sum()
    if vals.shape[1] > k:
        kth = vals[:, k - 1]
        boundary = ((vals[:, k] == kth) & ~torch.isneginf(kth)).sum()
    else:
        boundary = torch.zeros_like(inside)
    counts = torch.stack([boundary, inside])
    if scores.device.type != "cuda":
        return _Chunk(start, stop, scores, vals, ids, counts.cpu(), None)
    host = torch.empty(2, dtype=counts.dtype, pin_memory=True)
    host.copy_(counts, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return _Chunk(start, stop, scores, vals, ids, host, done)


def _finish(chunk: _Chunk, k: int, out_scores: torch.Tensor, out_ids: torch.Tensor) -> None:
    """The tie rule on a chunk's candidates (its host-decided steps only where its counts say so), into the output."""
    if chunk.done is not None:
        chunk.done.synchronize()  # this chunk's counts have landed; the next chunk keeps the device busy
    boundary, inside = chunk.counts.tolist()
    vals, ids = apply_tie_rule(chunk.scores, chunk.vals, chunk.ids, k, boundary=boundary > 0, inside=inside > 0)
    vals, ids = pad_topk(vals, ids, k)
    out_scores[chunk.start : chunk.stop] = vals
    out_ids[chunk.start : chunk.stop] = ids
