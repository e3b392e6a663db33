"""The fusion's arithmetic: each part's scores put on one scale by their spread over all items (recsys/rankers/fusion.py
explains the formula). Torch only: the evaluation stage's fusion and the serving bundle both compute with it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SPREAD_FLOOR = 1e-12  # a user whose scores are all equal (no history) gets a zero part, not a division by 0


def item_covariance(items: torch.Tensor) -> torch.Tensor:
    """float64 [D, D]: the covariance of the item vectors [I, D] (centred, ddof 1)."""
    x = items.double()
    centred = x - x.mean(dim=0, keepdim=True)
    return centred.t() @ centred / max(x.shape[0] - 1, 1)


def spread(queries: torch.Tensor, covariance: torch.Tensor) -> torch.Tensor:
    """float32 [U]: the standard deviation over all items of each query's scores, sqrt(q' C q)."""
    q = queries.double()
    return ((q @ covariance) * q).sum(dim=1).clamp_min(0).sqrt().clamp_min(SPREAD_FLOOR).float()


def fuse_queries(
    queries: Sequence[torch.Tensor], covariances: Sequence[torch.Tensor], weights: Sequence[float]
) -> torch.Tensor:
    """float32 [B, sum of the parts' D]: each part's queries divided by the spread of their scores over all items
    (``spread``, from its items' covariance), times the part's weight, side by side (module docstring)."""
    return torch.cat([w * q / spread(q, c)[:, None] for q, c, w in zip(queries, covariances, weights)], dim=1)
