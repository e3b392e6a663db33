"""Each item's co-occurrence neighbours in the training split: the candidate tower's graph feature.

Item j is a neighbour of item i when users who trained on i also trained on j. Scores are the
co-occurrence counts normalised by both items' degrees, ``c_ij / sqrt(d_i d_j)`` (LightGCN's
symmetric normalisation: without it every item's neighbours are the most popular items), and an
item keeps its ``k`` best (ties: lower item id first). The candidate tower reads the mean of the
neighbours' embeddings beside the item's own: two hops of the user-item graph, which a two-tower
model over ids alone never sees (docs/quality.md).

Cost: the products ``X[:, chunk]^T X`` touch sum over users of (items per user)^2 pairs in all;
items are processed in chunks whose product holds at most ``max_chunk_pairs`` entries, so memory
stays bounded whatever the catalog size. Of a long row only the entries that can make its top k are sorted
(``_score_floors``), a fraction of sorting every pair (scripts/bench_item_neighbors.py; docs/performance.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from recsys.data.dataset import Interactions, RetrievalData, read_split

DEFAULT_MAX_CHUNK_PAIRS = 2_000_000  # ~100 MB of transient arrays per chunk
SAMPLE_PER_K = 8  # a long row's score floor comes from 8k of its entries (_score_floors)


def item_neighbors(
    train: Interactions, num_users: int, num_items: int, k: int, *, max_chunk_pairs: int = DEFAULT_MAX_CHUNK_PAIRS
) -> tuple[np.ndarray, np.ndarray]:
    """(indptr [num_items + 1], neighbour ids): item i's neighbours are ``ids[indptr[i]:indptr[i+1]]``,
    best first, at most ``k``, never i itself; an item no user shares with another has none."""
    if k < 1:
        raise ValueError(f"data.item_neighbors={k}: must be >= 1 to compute neighbours (0 disables the feature)")
    x = sp.csr_matrix(
        (np.ones(len(train), dtype=np.float32), (train.user_ids, train.item_ids)), shape=(num_users, num_items)
    )
    x.sum_duplicates()
    x.data[:] = 1.0  # a user who saw an item twice co-occurs with it once
    xt = x.T.tocsr()  # items x users
    item_degree = np.diff(xt.indptr).astype(np.float64)
    # upper bound of each item's row of the product: the summed degrees of its users
    pairs = np.concatenate([[0.0], np.cumsum(xt @ np.diff(x.indptr).astype(np.float64))])
    indptrs, ids = [np.zeros(1, dtype=np.int64)], []
    lo = 0
    while lo < num_items:  # items [lo, hi): as many as fit the budget, at least one
        hi = int(np.searchsorted(pairs, pairs[lo] + max_chunk_pairs, side="right")) - 1
        hi = min(max(hi, lo + 1), num_items)
        counts, chunk_ids = _top_k_rows(xt[lo:hi] @ x, lo, item_degree, k)
        indptrs.append(indptrs[-1][-1] + np.cumsum(counts))
        ids.append(chunk_ids)
        lo = hi
    return np.concatenate(indptrs).astype(np.int64), (np.concatenate(ids) if ids else np.zeros(0)).astype(np.int64)


def _top_k_rows(cooc: sp.csr_matrix, first_item: int, degree: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-row count, ids) of each row's ``k`` best-scored columns, the row's own item left out."""
    cooc = cooc.tocoo()  # from CSR: the rows ascending, each row's entries together
    rows, cols = cooc.row.astype(np.int64), cooc.col.astype(np.int64)
    keep = cols != rows + first_item
    rows, cols, counts = rows[keep], cols[keep], cooc.data[keep].astype(np.float64)
    scores = counts / np.sqrt(degree[rows + first_item] * degree[cols])
    contenders = scores >= _score_floors(rows, scores, cooc.shape[0], k)[rows]
    rows, cols, scores = rows[contenders], cols[contenders], scores[contenders]
    order = np.lexsort((cols, -scores, rows))  # by row, best score first, lower id on ties
    rows, cols = rows[order], cols[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows)
    best = rank < k
    return np.bincount(rows[best], minlength=cooc.shape[0]), cols[best]


def _score_floors(rows: np.ndarray, scores: np.ndarray, num_rows: int, k: int) -> np.ndarray:
    """float64 [num_rows]: a score each row's ``k`` best reach, so that only entries at or above it need sorting.

    A row of more than ``SAMPLE_PER_K * k`` entries takes the k-th best of ``SAMPLE_PER_K * k`` of them, evenly
    spaced: never above the row's own k-th best (a subset's k-th best cannot beat the whole row's), so every
    entry of the top k, ties at its edge included, stays; the sort then sees ~1/SAMPLE_PER_K of a long row
    (the whole sort was most of the neighbours' time). Shorter rows keep every entry (-inf)."""
    floors = np.full(num_rows, -np.inf)
    lengths = np.bincount(rows, minlength=num_rows)
    sample = SAMPLE_PER_K * k
    long_rows = np.flatnonzero(lengths > sample)
    if len(long_rows) == 0:
        return floors
    starts = (np.cumsum(lengths) - lengths)[long_rows]
    picks = starts[:, None] + np.arange(sample)[None, :] * lengths[long_rows][:, None] // sample
    floors[long_rows] = np.partition(scores[picks], sample - k, axis=1)[:, sample - k]
    return floors


def with_item_neighbors(data: RetrievalData, k: int) -> RetrievalData:
    """``data`` with each item's ``k`` co-occurrence neighbours (``data.item_neighbors``; 0: unchanged).

    The neighbours come from the whole training split, also when ``data`` holds one rank's users
    (``data.shard_by_user``, or evaluation on ranks > 0): every rank must see the same candidate features.
    """
    if k <= 0:
        return data
    train = data.splits["train"]
    if data.user_range is not None:
        train = read_split(data.dir, "train", data.num_users, data.num_items)
        if data.valid_in_train:
            train = Interactions.concat(train, read_split(data.dir, "valid", data.num_users, data.num_items))
    indptr, ids = item_neighbors(train, data.num_users, data.num_items, k)
    return dataclasses.replace(data, item_neighbor_indptr=indptr, item_neighbor_ids=ids)
