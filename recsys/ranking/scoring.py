"""Rank every candidate for each query and score the top K: the one path the in-training
``Evaluator`` and the offline report share, so their numbers agree by construction.

    rank_and_score(queries [U, D], items [I, D], k, exclude=CSR [U, I], relevant=CSR [U, I], ...)
      -> ranked {model: (scores [U, k], ids [U, k])}, metrics {model: {"recall@10": ..., ...}}

The model ranks by inner product (``exact_topk``); ``others`` adds further rankers (the report's: each the
evaluation stage's top k, popularity's among them).
Excluded items are never ranked; ids are -1 where fewer than k items remain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import compute_metrics
from recsys.ranking.retrieval import exact_topk

TRAINED_ROW = "two_tower"  # the trained model's row: the name its ranker has in eval.rankers and results.json
Ranked = tuple[torch.Tensor, torch.Tensor]  # (scores [U, k], item ids [U, k])
Metrics = dict[str, float]
Scorer = Callable[..., Metrics]  # (topk ids [U, k] numpy, relevant CSR, ks, num_items=...) -> metrics


def rank_and_score(
    queries: torch.Tensor,
    items: torch.Tensor,
    k: int,
    *,
    exclude: UserItemCSR,
    relevant: UserItemCSR,
    ks: Sequence[int],
    chunk_size: int,
    model: str = TRAINED_ROW,
    others: Mapping[str, Callable[[], Ranked]] = {},
    score: Scorer = compute_metrics,
    unranked: torch.Tensor | None = None,
) -> tuple[dict[str, Ranked], dict[str, Metrics]]:
    """The top ``k`` of ``model`` (and ``others``) for every query, and ``score``'s metrics of each.

    ``score``:
    ``compute_metrics`` (all users here) or a stand-in that combines ranks' users (the Evaluator's).
    ``unranked``: bool [I], items ``model`` leaves out (never-trained ids: recsys/ranking/untrained.py).
    """
    num_items = items.shape[0]
    ranked: dict[str, Ranked] = {
        model: exact_topk(queries, items, k, exclude=exclude, chunk_size=chunk_size, unranked=unranked)
    }
    for name, rank in others.items():
        ranked[name] = rank()
    metrics = {name: score(ids.cpu().numpy(), relevant, ks, num_items=num_items) for name, (_, ids) in ranked.items()}
    return ranked, metrics
