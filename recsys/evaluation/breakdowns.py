"""Metrics broken down by user activity and by item popularity (the long tail).

User activity bucket (``activity_breakdown``): a user's number of distinct training items, cut at
fixed, roughly logarithmic edges (``ACTIVITY_EDGES`` = 0, 5, 10, 20, 50, 100, 200, 500, 1000):
bucket b holds the users with ``edges[b] <= count < edges[b + 1]`` (the last one is open), so the
buckets mean the same thing on every dataset and every run. Each bucket reports the mean of every
per-user metric (``metrics.per_user_metrics``) over its users with >= 1 relevant item. Empty
buckets are left out.

Item popularity bucket (``popularity_buckets``), from training frequencies only: sort the items by
training count, descending (ties: lower item id first), and let ``before(i)`` be the share of all
training interactions held by the items sorted strictly before item i. Then

    head   = items with before(i) <  head_share                (default 0.2)
    tail   = items with before(i) >= 1 - tail_share            (default 0.5)
    torso  = the rest

i.e. head is the shortest prefix of the most popular items holding >= 20% of the training
interactions, tail is the least popular items that together hold about the last 50% (items never
seen in training are always tail), torso is what lies between. Recall@K restricted to bucket b is,
per user with >= 1 relevant item in b,

    recall_b@K(u) = |top-K(u) ∩ relevant(u) ∩ b| / |relevant(u) ∩ b|

averaged over those users; ``topk_share_b@K`` is the share of all filled top-K slots that hold an
item of bucket b (how much of what the model recommends is head).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import hit_matrix, per_user_metrics

ACTIVITY_EDGES = (0, 5, 10, 20, 50, 100, 200, 500, 1000)  # ~log-spaced training-item counts
POPULARITY_BUCKETS = ("head", "torso", "tail")


def _nanmean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


def activity_buckets(
    user_train_counts: np.ndarray, edges: Sequence[int] = ACTIVITY_EDGES
) -> tuple[np.ndarray, list[str]]:
    """Bucket index of every user, int64 [U], and the bucket labels ("5-9", ..., "1000+").

    Args:
        user_train_counts: int [U], training items of each evaluated user.
        edges: strictly increasing lower bounds; edges[0] must be <= every count.
    """
    edges = np.asarray(edges, dtype=np.int64)
    counts = np.asarray(user_train_counts, dtype=np.int64)
    if edges.ndim != 1 or edges.size == 0 or (np.diff(edges) <= 0).any():
        raise ValueError(f"edges must be strictly increasing, got {edges.tolist()}")
    if counts.size and counts.min() < edges[0]:
        raise ValueError(f"a count {counts.min()} is below the first edge {edges[0]}")
    labels = [f"{lo}-{hi - 1}" if hi - 1 > lo else f"{lo}" for lo, hi in zip(edges[:-1], edges[1:])]
    labels.append(f"{edges[-1]}+")
    return np.searchsorted(edges, counts, side="right") - 1, labels


def activity_breakdown(
    per_user: dict[str, np.ndarray],
    user_train_counts: np.ndarray,
    *,
    edges: Sequence[int] = ACTIVITY_EDGES,
) -> list[dict]:
    """Mean of every per-user metric within each activity bucket.

    Args:
        per_user: ``metrics.per_user_metrics`` output, each float64 [U] (NaN = no relevant item).
        user_train_counts: int [U], training items of each of those users.
        edges: bucket lower bounds (see the module docstring).

    Returns:
        One dict per non-empty bucket, in order: ``{"bucket": label, "min_train_items",
        "max_train_items" (None for the open bucket), "num_users", "num_users_evaluated",
        <metric>: mean ...}``.
    """
    bucket, labels = activity_buckets(user_train_counts, edges)
    any_metric = next(iter(per_user.values()))
    if any_metric.shape != bucket.shape:
        raise ValueError(f"per-user metrics have {any_metric.shape[0]} users, counts have {bucket.shape[0]}")
    evaluated = ~np.isnan(any_metric)
    rows = []
    for b, label in enumerate(labels):
        in_bucket = bucket == b
        if not in_bucket.any():
            continue
        row = {
            "bucket": label,
            "min_train_items": int(edges[b]),
            "max_train_items": int(edges[b + 1]) - 1 if b + 1 < len(edges) else None,
            "num_users": int(in_bucket.sum()),
            "num_users_evaluated": int((in_bucket & evaluated).sum()),
        }
        row.update({name: _nanmean(values[in_bucket]) for name, values in per_user.items()})
        rows.append(row)
    return rows


def popularity_buckets(
    item_train_counts: np.ndarray, *, head_share: float = 0.2, tail_share: float = 0.5
) -> np.ndarray:
    """Bucket of every item by training popularity: int8 [I], 0 = head, 1 = torso, 2 = tail.

    Exact rule in the module docstring (``before(i)`` = interaction share of the items sorted
    before i). With no training interaction at all, every item is tail.
    """
    counts = np.asarray(item_train_counts, dtype=np.float64)
    if not (0.0 <= head_share <= 1.0 and 0.0 <= tail_share <= 1.0 and head_share + tail_share <= 1.0):
        raise ValueError(
            f"need 0 <= head_share, tail_share and head_share + tail_share <= 1, got {head_share}, {tail_share}"
        )
    total = counts.sum()
    out = np.full(counts.shape[0], 2, dtype=np.int8)
    if total <= 0:
        return out
    order = np.lexsort((np.arange(counts.shape[0]), -counts))  # count desc, id asc
    before = np.concatenate([[0.0], np.cumsum(counts[order])[:-1]]) / total
    sorted_bucket = np.where(before < head_share, 0, np.where(before >= 1.0 - tail_share, 2, 1)).astype(np.int8)
    out[order] = sorted_bucket
    return out


def popularity_breakdown(
    topk_ids: np.ndarray,
    relevant: UserItemCSR,
    ks: Sequence[int],
    item_bucket: np.ndarray,
    item_train_counts: np.ndarray,
) -> list[dict]:
    """Recall@K restricted to the relevant items of each popularity bucket, and the top-K share of each bucket.

    Args:
        topk_ids: int64 [U, Kmax], ranked item ids, -1 for empty slots.
        relevant: [U rows] CSR of held-out items.
        ks: cut-offs in [1, Kmax].
        item_bucket: int [I] from ``popularity_buckets``.
        item_train_counts: [I] training counts (for each bucket's share of interactions).

    Returns:
        One dict per bucket (head, torso, tail): ``{"bucket", "num_items", "train_interaction_share",
        "num_relevant_pairs", "num_users_evaluated", "recall@K", "topk_share@K"}``.
    """
    topk_ids = np.asarray(topk_ids, dtype=np.int64)
    item_bucket = np.asarray(item_bucket, dtype=np.int64)
    counts = np.asarray(item_train_counts, dtype=np.float64)
    if item_bucket.shape[0] != relevant.num_items:
        raise ValueError(f"item_bucket has {item_bucket.shape[0]} items, relevant has {relevant.num_items}")
    num_buckets = len(POPULARITY_BUCKETS)
    hits = hit_matrix(topk_ids, relevant)  # [U, Kmax]
    slot_bucket = np.where(topk_ids >= 0, item_bucket[np.maximum(topk_ids, 0)], -1)  # [U, Kmax]
    # |relevant(u) ∩ b| for every (u, b): [U, num_buckets]
    rel_per_bucket = np.bincount(
        relevant.row_user_ids() * num_buckets + item_bucket[relevant.indices],
        minlength=relevant.num_users * num_buckets,
    ).reshape(relevant.num_users, num_buckets)
    total = counts.sum()
    rows = []
    for b, name in enumerate(POPULARITY_BUCKETS):
        in_b = item_bucket == b
        has_rel = rel_per_bucket[:, b] > 0
        row = {
            "bucket": name,
            "num_items": int(in_b.sum()),
            "train_interaction_share": float(counts[in_b].sum() / total) if total > 0 else float("nan"),
            "num_relevant_pairs": int(rel_per_bucket[:, b].sum()),
            "num_users_evaluated": int(has_rel.sum()),
        }
        for k in ks:
            if not 1 <= k <= topk_ids.shape[1]:
                raise ValueError(f"k={k} must be in [1, {topk_ids.shape[1]}]")
            bucket_hits = (hits[:, :k] & (slot_bucket[:, :k] == b)).sum(axis=1)
            recall = bucket_hits[has_rel] / rel_per_bucket[has_rel, b]
            row[f"recall@{k}"] = float(recall.mean()) if recall.size else float("nan")
            filled = (slot_bucket[:, :k] >= 0).sum()
            row[f"topk_share@{k}"] = float((slot_bucket[:, :k] == b).sum() / filled) if filled else float("nan")
        rows.append(row)
    return rows


def breakdowns(
    topk_ids: np.ndarray,
    relevant: UserItemCSR,
    ks: Sequence[int],
    *,
    user_train_counts: np.ndarray,
    item_train_counts: np.ndarray,
    activity_edges: Sequence[int] = ACTIVITY_EDGES,
    head_share: float = 0.2,
    tail_share: float = 0.5,
) -> dict:
    """Both breakdowns of one model's top-K on one split (see the module docstring for the buckets).

    Args:
        topk_ids: int64 [U, Kmax]; relevant: [U rows] CSR; ks: cut-offs.
        user_train_counts: int [U], training items of each evaluated user (row order of topk_ids).
        item_train_counts: [I], training interactions of every item.

    Returns:
        ``{"user_activity": {"edges", "buckets": [...]}, "item_popularity": {"head_share",
        "tail_share", "buckets": [...]}}`` (bucket rows as in ``activity_breakdown`` /
        ``popularity_breakdown``).
    """
    per_user = per_user_metrics(topk_ids, relevant, ks)
    item_bucket = popularity_buckets(item_train_counts, head_share=head_share, tail_share=tail_share)
    return {
        "user_activity": {
            "edges": [int(e) for e in activity_edges],
            "buckets": activity_breakdown(per_user, user_train_counts, edges=activity_edges),
        },
        "item_popularity": {
            "head_share": head_share,
            "tail_share": tail_share,
            "buckets": popularity_breakdown(topk_ids, relevant, ks, item_bucket, item_train_counts),
        },
    }
