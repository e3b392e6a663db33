"""Which candidates a query is not scored against: its accidental hits and, with model.loss.mask_history, its history.

- **Accidental hits**: a candidate whose item is the query's positive, in another column (the batch's repeats of
  that item, a sampled negative that drew it).
- **The query's own history** (``QueryHistory``): a candidate whose item is in the query's history bag. A profile
  bag's query is the mean of its items' vectors, so it scores them high, and the softmax pushes each one the batch
  holds as a candidate down as a negative, though ranking masks a user's training items anyway: on a 500-item
  catalogue a batch of 2,048 holds nearly every item, so that is each of a user's ~15 other items every step
  (docs/quality.md, "The query's own items as negatives").

Accidental hits are (rows, columns) pairs found by searching the candidates' sorted ids on the host and a dense
comparison on a device (sizing the pairs there would need a host sync); the history is a dense boolean mask built
without a host sync on both (on the host 4x faster than searching its pairs, which a popular item repeats across the
batch: scripts/bench_loss.py --history).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def sorted_candidates(candidate_item_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted ids, their columns): what ``accidental_hits`` searches; sorted once when several row blocks search it."""
    return torch.sort(candidate_item_ids)


def accidental_hits(
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    labels: torch.Tensor,
    candidates_sorted: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of every candidate whose item is its query's positive, the label itself excepted.

    Found by sorting the candidates' ids (or ``candidates_sorted``, ``sorted_candidates``' result), never as a
    B_q x C comparison, far slower on CPU at large batches (docs/performance.md, "What changed for
    speed"). (On CUDA the pair count would need a host sync to size the result; the loss uses the dense mask there.)
    """
    sorted_ids, order = candidates_sorted if candidates_sorted is not None else sorted_candidates(candidate_item_ids)
    first = torch.searchsorted(sorted_ids, query_item_ids)
    counts = torch.searchsorted(sorted_ids, query_item_ids, right=True) - first
    rows = torch.repeat_interleave(torch.arange(query_item_ids.numel(), device=counts.device), counts)
    # position of each pair within its query's run of equal ids, then the candidate column there
    run_start = torch.cumsum(counts, 0) - counts
    cols = order[torch.repeat_interleave(first - run_start, counts) + torch.arange(rows.numel(), device=counts.device)]
    keep = cols != labels[rows]
    return rows[keep], cols[keep]


@dataclass
class QueryHistory:
    """Each query's history items as (row, item) pairs, found once among the candidates for every row block:
    ``positions`` is each pair's item's first position among the sorted candidate ids (-1: no candidate holds it),
    ``column_first`` each candidate column's item's."""

    rows: torch.Tensor  # P, int64
    positions: torch.Tensor  # P, int64
    column_first: torch.Tensor  # C, int64

    @classmethod
    def of(cls, lengths: torch.Tensor, items: torch.Tensor, candidate_item_ids: torch.Tensor) -> QueryHistory:
        """From each query's bag: ``lengths`` (one per query), ``items`` (the bags one after another)."""
        # output_size: the items' count, known from the shape, so that a GPU sizes the result without a host sync
        rows = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=items.numel()
        )
        sorted_ids, order = sorted_candidates(candidate_item_ids)
        num = sorted_ids.numel()
        # each sorted position's first position among equal ids, then each column's
        starts = torch.ones(num, dtype=torch.bool, device=sorted_ids.device)
        starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
        positions = torch.arange(num, device=sorted_ids.device)
        run_first = torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), 0).values
        column_first = torch.empty_like(run_first)
        column_first[order] = run_first
        found = torch.searchsorted(sorted_ids, items).clamp_(max=max(num - 1, 0))  # an equal id's first position
        found = torch.where(sorted_ids[found] == items, found, -1) if num else torch.full_like(items, -1)
        return cls(rows, found, column_first)

    def mask(self, lo: int, hi: int) -> torch.Tensor:
        """[hi - lo, C] bool: True where candidate c's item is in query row r's history (labels not excepted), with
        no host sync: each pair marks its item's first sorted position in an (hi - lo + 1) x C grid (pairs outside
        the rows, or whose item is no candidate, mark the spare last row), and each column reads its item's mark."""
        spare = hi - lo
        inside = (self.rows >= lo) & (self.rows < hi) & (self.positions >= 0)
        grid = torch.zeros(spare + 1, max(self.column_first.numel(), 1), dtype=torch.bool, device=self.rows.device)
        grid[torch.where(inside, self.rows - lo, spare), torch.where(inside, self.positions, 0)] = True
        return grid[:spare][:, self.column_first]
