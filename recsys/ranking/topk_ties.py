"""The tie rule of exact top-k: the k best of a row by (score descending, item id ascending), -1 / -inf padded.

Both paths of ``retrieval.chunked_topk`` (the host's and ``device_topk``'s) select the k + 1 best candidates of each
row first, in any order among equal scores, then hand them here: ``apply_tie_rule`` makes the choice and the order
deterministic, ``pad_topk`` marks the slots no item filled.
"""

from __future__ import annotations

import torch


def apply_tie_rule(
    scores: torch.Tensor,
    vals: torch.Tensor,
    ids: torch.Tensor,
    k: int,
    *,
    boundary: bool = True,
    inside: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of each row of ``scores`` [C, I] ordered by (score desc, id asc), [C, min(k, I)] each, from its
    ``min(k + 1, I)`` best candidates ``vals`` / ``ids`` (sorted by score descending, ties in any order).

    ``torch.topk`` picks an arbitrary subset of the items tied at the k-th score. Taking k + 1
    candidates finds the rows where that matters (candidate k+1 scores the same as candidate k);
    only those rows are rescanned to take the lowest ids among the tie. Rows with equal scores
    inside the chosen set are then put in order by two small stable sorts.
    ``boundary`` / ``inside`` False: the caller knows no row has that kind of tie (the step is skipped).
    """
    if vals.shape[1] > k:
        kth = vals[:, k - 1]
        ambiguous = (vals[:, k] == kth) & ~torch.isneginf(kth)  # -inf slots become -1 padding anyway
        vals, ids = vals[:, :k], ids[:, :k].clone()
        rows = ambiguous.nonzero().squeeze(1) if boundary else None
        if rows is not None and rows.numel() > 0:
            _fix_boundary_ties(scores, vals, ids, rows)
    if not inside:
        return vals, ids
    # Within the chosen set: order by id, then stably by score (desc), giving (score desc, id asc);
    # only rows holding equal scores need it (topk already sorted the values).
    tied = (vals[:, 1:] == vals[:, :-1]).any(dim=1).nonzero().squeeze(1)
    if tied.numel() > 0:
        t_vals, t_ids = vals[tied], ids[tied]
        t_ids, order = torch.sort(t_ids, dim=1, stable=True)
        t_vals = torch.gather(t_vals, 1, order)
        t_vals, order = torch.sort(t_vals, dim=1, descending=True, stable=True)
        vals[tied], ids[tied] = t_vals, torch.gather(t_ids, 1, order)
    return vals, ids


def pad_topk(vals: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[C, w <= k] -> [C, k]: id -1 where the score is -inf (an excluded item or no item), -inf / -1 past w."""
    ids = torch.where(torch.isneginf(vals), -1, ids)
    width = vals.shape[1]
    if width < k:  # fewer items than k: pad
        vals = torch.nn.functional.pad(vals, (0, k - width), value=float("-inf"))
        ids = torch.nn.functional.pad(ids, (0, k - width), value=-1)
    return vals, ids


def _fix_boundary_ties(scores: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Replaces, in place, ``ids[r]``'s entries tied at the k-th score by the lowest tied ids of ``scores[r]``.

    ``vals`` [C, k] is sorted descending, so in row r the slots equal to the k-th score are the
    last ``need`` ones; the row's tied items in ascending id order, first ``need`` of them, fill them.
    """
    kth = vals[rows, -1:]  # [R, 1]
    slot_is_tie = vals[rows] == kth  # [R, k]
    need = slot_is_tie.sum(dim=1, keepdim=True)  # [R, 1]
    item_is_tie = scores[rows] == kth  # [R, I]
    take = item_is_tie & (item_is_tie.cumsum(dim=1) <= need)  # the `need` lowest tied ids per row
    tied_ids = take.nonzero()[:, 1]  # row-major, so ascending ids within each row, `need` per row
    row_ids = ids[rows]
    row_ids[slot_is_tie] = tied_ids  # boolean assignment is row-major as well
    ids[rows] = row_ids
