"""Exact full-corpus top-k by chunked matmul, with per-user exclusions (seen items masked).

For every query row u: ``scores[u, i] = <queries[u], items[i]>`` over all I items, excluded
(u, i) pairs set to -inf, then the k best items ranked by (score descending, item id ascending).
Only ``chunk_size x I`` scores exist at any time, never the full U x I matrix (two such blocks on an accelerator,
where ``device_topk`` masks and ranks them without a host sync a chunk; the same results to the last id).

    $ python scripts/bench_eval.py --num-users 20000   # speed vs the bare matmuls
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from recsys.ranking.device_topk import device_chunked_topk
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.topk_ties import apply_tie_rule, pad_topk
from recsys.utils import progress


def exact_topk(
    queries: torch.Tensor,
    items: torch.Tensor,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    unranked: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k items per query by inner product, exact, over the whole corpus.

    Args:
        queries: [U, D] query embeddings (cast to float32).
        items: [I, D] candidate embeddings, on the same device as ``queries`` (cast to float32).
        k: number of items to return per query, >= 1.
        exclude: optional [U rows, I items] CSR; row u lists the items never returned for query u.
        chunk_size: query rows scored per matmul; peak extra memory is about
            ``chunk_size * I * 4`` bytes (4096 x 27k items = 442 MB).
        unranked: optional bool [I]: items never returned for any query (items the model has no
            vector of its own for: recsys/ranking/untrained.py).

    Returns:
        scores: float32 [U, k], descending per row.
        ids: int64 [U, k], item ids; equal scores are ordered by lower item id first, and the
            set of k items is chosen by the same rule (deterministic, independent of chunk_size).
            When fewer than k items remain after exclusion, the tail slots hold id -1 and
            score -inf.

    Embeddings are assumed finite (a NaN score ranks arbitrarily).
    """
    if queries.dim() != 2 or items.dim() != 2 or queries.shape[1] != items.shape[1]:
        raise ValueError(f"expected queries [U, D] and items [I, D], got {tuple(queries.shape)}, {tuple(items.shape)}")
    num_queries, num_items = queries.shape[0], items.shape[0]
    items_t = items.to(dtype=torch.float32).t()
    left_out = None if unranked is None or not bool(unranked.any()) else unranked.to(queries.device)

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        scores = torch.mm(queries[start:stop].to(dtype=torch.float32), items_t, out=out)
        return scores if left_out is None else scores.masked_fill_(left_out, float("-inf"))

    return chunked_topk(
        score_chunk, num_queries, num_items, k, exclude=exclude, chunk_size=chunk_size, device=queries.device
    )


ScoreChunk = Callable[[int, int, torch.Tensor], torch.Tensor]


def chunked_topk(
    score_chunk: ScoreChunk,
    num_queries: int,
    num_items: int,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per query row of any score matrix that is produced chunk by chunk (the engine of ``exact_topk``).

    Args:
        score_chunk: ``score_chunk(start, stop, out)`` returns float32 scores [stop - start, I] of query
            rows ``start:stop``; ``out`` is a reusable float32 buffer of that shape it may write into
            (and return), or ignore. The returned tensor is masked in place.
        num_queries: U; num_items: I.
        k, exclude, chunk_size: as in ``exact_topk`` (same tie rule, same -1 / -inf padding).
        device: where the output tensors and the score buffer live; other than the CPU, the device path
            (``device_topk.device_chunked_topk``: mask and candidates on the device, no host sync a chunk).

    Returns:
        scores float32 [U, k], ids int64 [U, k], as in ``exact_topk``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if exclude is not None and (exclude.num_users != num_queries or exclude.num_items != num_items):
        raise ValueError(
            f"exclude is ({exclude.num_users} users, {exclude.num_items} items), "
            f"queries/items are ({num_queries}, {num_items})"
        )
    if torch.device(device).type != "cpu":  # masked and ranked on the device, no host sync a chunk
        return device_chunked_topk(
            score_chunk, num_queries, num_items, k, exclude=exclude, chunk_size=chunk_size, device=device
        )
    out_scores = torch.full((num_queries, k), float("-inf"), dtype=torch.float32, device=device)
    out_ids = torch.full((num_queries, k), -1, dtype=torch.int64, device=device)
    if num_items == 0 or num_queries == 0:
        return out_scores, out_ids
    # One score buffer reused by every chunk: a fresh chunk_size x I allocation per chunk costs
    # page faults that, on CPU, take longer than the matmul itself.
    buffer = torch.empty(min(chunk_size, num_queries), num_items, dtype=torch.float32, device=device)
    for start in range(0, num_queries, chunk_size):
        stop = min(start + chunk_size, num_queries)
        scores = score_chunk(start, stop, buffer[: stop - start])  # [C, I]
        vals, ids = topk_from_scores(scores, k, exclude=exclude, row_offset=start)
        out_scores[start:stop] = vals
        out_ids[start:stop] = ids
        progress.advance(stop - start)  # the rows ranked, to the task open around (recsys.utils.progress)
    return out_scores, out_ids


def topk_from_scores(
    scores: torch.Tensor,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    row_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of a block of full score rows, with exclusions and the deterministic tie rule.

    Args:
        scores: float32 [C, I]; row r holds the scores of query ``row_offset + r`` over all I
            items. Excluded entries are set to -inf IN PLACE.
        k: >= 1.
        exclude: optional CSR over all queries; its rows ``row_offset : row_offset + C`` are used.
        row_offset: index of the first row of ``scores`` in ``exclude``.

    Returns:
        scores float32 [C, k] descending, ids int64 [C, k] ordered by (score desc, id asc); slots
        beyond the items left after exclusion hold -inf / -1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    num_rows, num_items = scores.shape
    if exclude is not None:
        _mask_excluded(scores, exclude, row_offset, row_offset + num_rows)
    # One candidate beyond k tells whether the k-th score is tied with an item left out.
    num_candidates = min(k + 1, num_items)
    if num_candidates == 0 or num_rows == 0:
        out_scores = torch.full((num_rows, k), float("-inf"), dtype=torch.float32, device=scores.device)
        return out_scores, torch.full((num_rows, k), -1, dtype=torch.int64, device=scores.device)
    vals, ids = _topk_sorted(scores, num_candidates)
    return pad_topk(*apply_tie_rule(scores, vals, ids, k), k)


def popularity_topk(
    item_counts: torch.Tensor,
    num_queries: int,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Most popular items per query: what ``exact_topk`` gives with ``score(u, i) = item_counts[i]`` for every u; an item
    never trained on (count 0) is never returned: a count of 0 says nothing, and only id order would rank those.

    Every query's ranking is one global order (count descending, id ascending) less its excluded items, so its top k lie
    among the first k + (its exclusions) items of that order: each block of queries is ranked over that head alone,
    O(queries x (k + exclusions)) rather than a score for every item (whose tie rule made it the costliest ranking of
    the evaluation stage: 300k items x 60k users took minutes).

    Args:
        item_counts: [I] training interactions per item (any numeric dtype; ordered in float32,
            so counts above 2**24 lose exactness).
        num_queries: U, the number of rows to return.
        k, exclude, chunk_size: as in ``exact_topk``.

    Returns:
        scores float32 [U, k], ids int64 [U, k], as in ``exact_topk``.
    """
    _check_popularity_inputs(item_counts, num_queries, k, exclude)
    counts = item_counts.to(dtype=torch.float32)
    device, num_items = counts.device, counts.shape[0]
    order = torch.sort(-counts, stable=True).indices  # count descending, then id ascending
    order = order[counts[order] > 0]
    out_scores = torch.full((num_queries, k), float("-inf"), dtype=torch.float32, device=device)
    out_ids = torch.full((num_queries, k), -1, dtype=torch.int64, device=device)
    lengths = exclude.lengths() if exclude is not None else np.zeros(num_queries, dtype=np.int64)
    position = torch.full((num_items,), -1, dtype=torch.int64, device=device)
    start = 0
    while start < num_queries:
        stop = min(start + chunk_size, num_queries)
        width = min(k + int(lengths[start:stop].max(initial=0)), len(order))
        stop = min(stop, start + max(1, POPULARITY_BLOCK // max(width, 1)))  # a block of [rows, width] at most
        head = order[:width]
        keep = torch.ones(stop - start, width, dtype=torch.bool, device=device)
        if exclude is not None and width:
            lo, hi = int(exclude.indptr[start]), int(exclude.indptr[stop])
            position[head] = torch.arange(width, device=device)
            rows = torch.from_numpy(np.repeat(np.arange(stop - start), lengths[start:stop])).to(device)
            cols = position[torch.from_numpy(exclude.indices[lo:hi]).to(device)]
            seen = cols >= 0
            keep[rows[seen], cols[seen]] = False
            position[head] = -1
        rank = keep.cumsum(dim=1)
        rows, cols = (keep & (rank <= k)).nonzero(as_tuple=True)
        slots = rank[rows, cols] - 1
        out_ids[start + rows, slots] = head[cols]
        out_scores[start + rows, slots] = counts[head[cols]]
        progress.advance(stop - start)
        start = stop
    return out_scores, out_ids


def _check_popularity_inputs(item_counts: torch.Tensor, num_queries: int, k: int, exclude: UserItemCSR | None) -> None:
    if item_counts.dim() != 1:
        raise ValueError(f"item_counts must be 1-D [I], got {tuple(item_counts.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    num_items = item_counts.shape[0]
    if exclude is not None and (exclude.num_users != num_queries or exclude.num_items != num_items):
        raise ValueError(
            f"exclude is ({exclude.num_users} users, {exclude.num_items} items), "
            f"queries/items are ({num_queries}, {num_items})"
        )


POPULARITY_BLOCK = 1 << 24  # candidates (rows x head width) ranked at once by ``popularity_topk``: 16M, ~0.2 GB


def _mask_excluded(scores: torch.Tensor, exclude: UserItemCSR, start: int, stop: int) -> None:
    """Sets ``scores[u - start, i] = -inf`` in place for every excluded (u, i) with start <= u < stop."""
    lo, hi = int(exclude.indptr[start]), int(exclude.indptr[stop])
    if hi == lo:
        return
    lengths = np.diff(exclude.indptr[start : stop + 1])
    rows = np.repeat(np.arange(stop - start, dtype=np.int64), lengths)
    cols = exclude.indices[lo:hi]
    rows_t = torch.from_numpy(rows).to(scores.device, non_blocking=True)
    cols_t = torch.from_numpy(cols).to(scores.device, non_blocking=True)
    scores.index_put_((rows_t, cols_t), torch.tensor(float("-inf"), device=scores.device))


def _topk_sorted(scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(scores, n, dim=1, sorted=True)``, on CPU by FAISS's k-selection heaps.

    ``torch.topk`` on CPU copies every row into (value, index) pairs and partially sorts them, which can cost more
    than the matmul that made the scores; FAISS's ``HeapArray.addn`` keeps one n-slot min-heap per row and compares
    each score with its heap's top only (OpenMP over rows; measured: docs/performance.md). Ties may come out in another order than
    topk's; the caller's tie rule does not depend on it. Slots that no finite score filled come
    back as FAISS's sentinel (lowest float, id -1) and are returned as -inf, like topk's -inf picks.
    """
    if scores.device.type != "cpu" or scores.dtype != torch.float32 or not scores.is_contiguous():
        return torch.topk(scores, n, dim=1, largest=True, sorted=True)
    try:
        import faiss  # noqa: PLC0415 (heavy import, only on this path)
    except ImportError:  # a dependency of the package, but exactness does not need it
        return torch.topk(scores, n, dim=1, largest=True, sorted=True)
    rows, cols = scores.shape
    vals = np.empty((rows, n), dtype=np.float32)
    ids = np.empty((rows, n), dtype=np.int64)
    heaps = faiss.float_minheap_array_t()  # min-heaps keep the n largest
    heaps.nh, heaps.k = rows, n
    heaps.val, heaps.ids = faiss.swig_ptr(vals), faiss.swig_ptr(ids)
    heaps.heapify()
    heaps.addn(cols, faiss.swig_ptr(scores.numpy()), 0, 0, rows)
    heaps.reorder()  # each row sorted, largest first
    vals[ids < 0] = float("-inf")
    return torch.from_numpy(vals), torch.from_numpy(ids)
