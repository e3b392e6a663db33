"""Which candidates a query is not scored against: its accidental hits and, with model.loss.mask_history, its history.

- **Accidental hits**: a candidate whose item is the query's positive, in another column (the batch's repeats of
  that item, a sampled negative that drew it).
- **The query's own history** (``QueryHistory``): a candidate whose item is in the query's history bag. A profile
  bag's query is the mean of its items' vectors, so it scores them high, and the softmax pushes each one the batch
  holds as a candidate down as a negative, though ranking masks a user's training items anyway: on a 500-item
  catalogue a batch of 2,048 holds nearly every item, so that is each of a user's ~15 other items every step
  (docs/quality.md, "The query's own items as negatives").

On the host both are (rows, columns) pairs found by searching the candidates' sorted ids; on a device, where sizing
the pairs would need a host sync, dense boolean masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def sorted_candidates(candidate_item_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted ids, their columns): what ``accidental_hits`` searches; sorted once when several row blocks search it."""
    return torch.sort(candidate_item_ids)


def item_hits(
    rows: torch.Tensor,
    item_ids: torch.Tensor,
    labels: torch.Tensor,
    candidates_sorted: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of every candidate whose item is ``item_ids[p]`` for the pairs (``rows[p]``, ``item_ids[p]``),
    each row's label column excepted.

    Found by searching the candidates' sorted ids (``sorted_candidates``), never as a rows x C comparison, far slower
    on CPU at large batches (docs/performance.md, "What changed for speed"). (On CUDA the pair count would need a host
    sync to size the result; the loss uses dense masks there.)
    """
    sorted_ids, order = candidates_sorted
    first = torch.searchsorted(sorted_ids, item_ids)
    counts = torch.searchsorted(sorted_ids, item_ids, right=True) - first
    hit_rows = torch.repeat_interleave(rows, counts)
    # position of each pair within its item's run of equal ids, then the candidate column there
    run_start = torch.cumsum(counts, 0) - counts
    offsets = torch.repeat_interleave(first - run_start, counts) + torch.arange(hit_rows.numel(), device=counts.device)
    cols = order[offsets]
    keep = cols != labels[hit_rows]
    return hit_rows[keep], cols[keep]


def accidental_hits(
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    labels: torch.Tensor,
    candidates_sorted: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of every candidate whose item is its query's positive, the label itself excepted
    (``item_hits`` of each query's own positive; ``candidates_sorted``: ``sorted_candidates``' result, or None)."""
    if candidates_sorted is None:
        candidates_sorted = sorted_candidates(candidate_item_ids)
    rows = torch.arange(query_item_ids.numel(), device=query_item_ids.device)
    return item_hits(rows, query_item_ids, labels, candidates_sorted)


@dataclass
class QueryHistory:
    """Each query's history items as (row, item) pairs, rows ascending, and the candidates' ids sorted once for every
    row block that searches them."""

    rows: torch.Tensor  # P, int64, ascending
    items: torch.Tensor  # P, int64
    candidates_sorted: tuple[torch.Tensor, torch.Tensor]  # sorted_candidates(candidate ids)

    @classmethod
    def of(cls, lengths: torch.Tensor, items: torch.Tensor, candidate_item_ids: torch.Tensor) -> QueryHistory:
        """From each query's bag: ``lengths`` (one per query), ``items`` (the bags one after another)."""
        # output_size: the items' count, known from the shape, so that a GPU sizes the result without a host sync
        rows = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=items.numel()
        )
        return cls(rows, items, sorted_candidates(candidate_item_ids))

    def hits(
        self, lo: int, hi: int, labels: torch.Tensor, candidates_sorted: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows - lo, columns) of the query rows [lo, hi)'s history items among the candidates, each row's label
        column excepted (``labels``: rows [lo, hi)'s). Host only (the row range is sliced by host integers)."""
        start, end = torch.searchsorted(self.rows, torch.tensor([lo, hi], device=self.rows.device)).tolist()
        return item_hits(
            self.rows[start:end] - lo, self.items[start:end], labels, candidates_sorted or self.candidates_sorted
        )

    def mask(self, lo: int, hi: int, candidate_item_ids: torch.Tensor) -> torch.Tensor:
        """[hi - lo, C] bool: True where candidate c's item is in query row r's history (labels not excepted), with
        no host sync: each pair marks its item's first sorted position in an (hi - lo + 1) x C grid (pairs outside
        the rows, or whose item is no candidate, mark the spare last row), and each column reads its item's mark."""
        sorted_ids, order = self.candidates_sorted
        num = sorted_ids.numel()
        # each sorted position's first position among equal ids, and each column's
        starts = torch.ones(num, dtype=torch.bool, device=sorted_ids.device)
        starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
        positions = torch.arange(num, device=sorted_ids.device)
        run_first = torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), 0).values
        column_first = torch.empty_like(run_first)
        column_first[order] = run_first
        found = torch.searchsorted(sorted_ids, self.items).clamp_(max=max(num - 1, 0))
        inside = (self.rows >= lo) & (self.rows < hi) & (sorted_ids[found] == self.items)
        spare = hi - lo
        grid = torch.zeros(spare + 1, max(num, 1), dtype=torch.bool, device=sorted_ids.device)
        grid[torch.where(inside, self.rows - lo, spare), torch.where(inside, found, 0)] = True
        return grid[:spare][:, column_first]
