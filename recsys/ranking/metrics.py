"""Offline top-k retrieval metrics: tiny pure functions over a per-user hit matrix.

Inputs shared by the per-user metrics:
    hits: bool [U, Kmax]; ``hits[u, j]`` is True when the item ranked j (0-based) for user u is
        relevant to u. Ids within a row are assumed distinct (``exact_topk`` guarantees it).
    num_relevant: int [U]; |relevant items| of each user.
    k: cut-off, 1 <= k <= Kmax.

Per-user metrics return float64 [U]. Users with no relevant item have no defined recall or NDCG
(NaN), and ``compute_metrics`` leaves them out of every average (they are not counted in
``num_users_evaluated``), as RecBole and Liang et al. do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from recsys.ranking.interactions import UserItemCSR


def hit_matrix(topk_ids: np.ndarray, relevant: UserItemCSR) -> np.ndarray:
    """``hits[u, j] = topk_ids[u, j] in relevant.row(u)``; bool [U, Kmax], False for empty slots (-1).

    Vectorized: the keys ``u * num_items + item`` of ``relevant`` are strictly increasing, so one
    ``searchsorted`` answers every (u, j) at once.
    """
    topk_ids = np.asarray(topk_ids)
    if topk_ids.ndim != 2 or topk_ids.shape[0] != relevant.num_users:
        raise ValueError(f"topk_ids must be [U={relevant.num_users}, Kmax], got {topk_ids.shape}")
    topk_ids = topk_ids.astype(np.int64, copy=False)
    if topk_ids.size and (topk_ids.min() < -1 or topk_ids.max() >= relevant.num_items):
        raise ValueError(f"topk_ids must be -1 (empty) or in [0, {relevant.num_items})")
    valid = topk_ids >= 0
    if relevant.nnz == 0:
        return np.zeros(topk_ids.shape, dtype=bool)
    users = np.arange(topk_ids.shape[0], dtype=np.int64)[:, None]
    query_keys = users * relevant.num_items + np.where(valid, topk_ids, 0)
    rel_keys = relevant.keys()
    pos = np.searchsorted(rel_keys, query_keys)
    found = rel_keys[np.minimum(pos, rel_keys.shape[0] - 1)] == query_keys
    return found & valid


def _check_k(hits: np.ndarray, k: int) -> None:
    if not 1 <= k <= hits.shape[1]:
        raise ValueError(f"k={k} must be in [1, {hits.shape[1]}] (the number of ranked slots)")


def _divide(numer: np.ndarray, denom: np.ndarray) -> np.ndarray:
    """numer / denom, NaN where denom == 0 (users with no relevant item)."""
    out = np.full(numer.shape, np.nan, dtype=np.float64)
    np.divide(numer, denom, out=out, where=denom > 0)
    return out


def recall_at_k(hits: np.ndarray, num_relevant: np.ndarray, k: int) -> np.ndarray:
    """Recall@k = |hits in top k| / |relevant|; float64 [U], NaN when |relevant| = 0."""
    _check_k(hits, k)
    return _divide(hits[:, :k].sum(axis=1), np.asarray(num_relevant))


def recall_liang_at_k(hits: np.ndarray, num_relevant: np.ndarray, k: int) -> np.ndarray:
    """Recall@k as in Liang et al. 2018 = |hits in top k| / min(k, |relevant|); float64 [U], NaN when |relevant| = 0."""
    _check_k(hits, k)
    return _divide(hits[:, :k].sum(axis=1), np.minimum(k, np.asarray(num_relevant)))


def ndcg_at_k(hits: np.ndarray, num_relevant: np.ndarray, k: int) -> np.ndarray:
    """NDCG@k with binary gain; float64 [U], NaN when |relevant| = 0.

    DCG = sum_{j<k} hit_j / log2(j + 2),  IDCG = sum_{j < min(k, |relevant|)} 1 / log2(j + 2),
    NDCG = DCG / IDCG (j is the 0-based rank).
    """
    _check_k(hits, k)
    discounts = 1.0 / np.log2(np.arange(k, dtype=np.float64) + 2.0)  # [k]
    dcg = hits[:, :k].astype(np.float64) @ discounts
    ideal = np.concatenate([[0.0], np.cumsum(discounts)])  # ideal[n] = IDCG with n relevant items in top k
    idcg = ideal[np.minimum(k, np.asarray(num_relevant))]
    return _divide(dcg, idcg)


def hit_rate_at_k(hits: np.ndarray, k: int) -> np.ndarray:
    """HitRate@k = 1 if any of the top k is relevant else 0; float64 [U]."""
    _check_k(hits, k)
    return hits[:, :k].any(axis=1).astype(np.float64)


def mrr_at_k(hits: np.ndarray, k: int) -> np.ndarray:
    """MRR@k = 1 / (1-based rank of the first relevant item) if it is within the top k else 0; float64 [U]."""
    _check_k(hits, k)
    top = hits[:, :k]
    first = top.argmax(axis=1)  # 0-based index of the first True (0 when none)
    return np.where(top.any(axis=1), 1.0 / (first + 1.0), 0.0)


def item_coverage_at_k(topk_ids: np.ndarray, k: int, num_items: int) -> float:
    """Coverage@k = |distinct item ids in the top k of all rows of ``topk_ids``| / num_items; empty slots (-1) ignored."""
    topk_ids = np.asarray(topk_ids)
    if not 1 <= k <= topk_ids.shape[1]:
        raise ValueError(f"k={k} must be in [1, {topk_ids.shape[1]}]")
    if num_items <= 0:
        raise ValueError(f"num_items must be >= 1, got {num_items}")
    top = topk_ids[:, :k]
    return float(np.count_nonzero(np.bincount(top[top >= 0], minlength=num_items)) / num_items)


PER_USER_METRICS = ("recall", "recall_liang", "ndcg", "hit_rate", "mrr")


def per_user_metrics(topk_ids: np.ndarray, relevant: UserItemCSR, ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Every per-user metric at every cut-off, one value per row of ``topk_ids``.

    Args:
        topk_ids: int64 [U, Kmax], ranked item ids per user, -1 for empty slots.
        relevant: [U rows] CSR of each user's held-out items.
        ks: cut-offs, each in [1, Kmax].

    Returns:
        ``{"recall@K", "recall_liang@K", "ndcg@K", "hit_rate@K", "mrr@K"}`` for each K in ks, each
        float64 [U]; every metric is NaN for users with no relevant item (left out of every mean,
        so ``np.nanmean(out[name])`` is what ``compute_metrics`` reports).
    """
    topk_ids = np.asarray(topk_ids)
    num_relevant = relevant.lengths()
    no_relevant = num_relevant == 0
    hits = hit_matrix(topk_ids, relevant)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(hits, num_relevant, k)
        out[f"recall_liang@{k}"] = recall_liang_at_k(hits, num_relevant, k)
        out[f"ndcg@{k}"] = ndcg_at_k(hits, num_relevant, k)
        out[f"hit_rate@{k}"] = np.where(no_relevant, np.nan, hit_rate_at_k(hits, k))
        out[f"mrr@{k}"] = np.where(no_relevant, np.nan, mrr_at_k(hits, k))
    return out


def compute_metrics(
    topk_ids: np.ndarray,
    relevant: UserItemCSR,
    ks: Sequence[int],
    *,
    num_items: int,
) -> dict[str, float]:
    """All metrics at every cut-off, averaged over the users with >= 1 relevant item.

    Args:
        topk_ids: int64 [U, Kmax], ranked item ids per user, -1 for empty slots.
        relevant: [U rows] CSR of each user's held-out items; row u belongs to ``topk_ids[u]``.
        ks: cut-offs, each in [1, Kmax].
        num_items: corpus size for coverage.

    Returns:
        ``{"recall@K", "recall_liang@K", "ndcg@K", "hit_rate@K", "mrr@K", "coverage@K"}`` for each
        K in ks, plus ``"num_users_evaluated"``. Coverage is over the top-K of the evaluated users
        only. Means are NaN when no user has a relevant item. The per-user values are
        ``per_user_metrics``.
    """
    topk_ids = np.asarray(topk_ids)
    if relevant.num_items != num_items:
        raise ValueError(f"relevant.num_items={relevant.num_items} != num_items={num_items}")
    evaluated = relevant.lengths() > 0
    per_user = per_user_metrics(topk_ids, relevant, ks)
    topk_evaluated = topk_ids[evaluated]

    def mean(values: np.ndarray) -> float:
        return float(values.mean()) if values.size else float("nan")

    out: dict[str, float] = {}
    for k in ks:
        for name in PER_USER_METRICS:
            out[f"{name}@{k}"] = mean(per_user[f"{name}@{k}"][evaluated])
        out[f"coverage@{k}"] = item_coverage_at_k(topk_evaluated, k, num_items)
    out["num_users_evaluated"] = float(evaluated.sum())
    return out
