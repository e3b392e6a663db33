"""SimpleX's cosine contrastive loss (Mao et al., CIKM 2021), mean over queries:

    (1 - cos(q, c+)) + negative_weight * mean_j max(0, cos(q, c_j) - margin)

over every other candidate j (accidental hits excluded, and with ``mask_history`` the query's own history items:
recsys/components/losses/candidate_hits.py). Queries and candidates are unit-norm, so the dot product is
the cosine; no temperature and no logQ: negatives below the margin cost nothing, which is what lets many easy
negatives in without drowning the hard ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from recsys.components.losses.candidate_hits import QueryHistory


@dataclass
class Config:
    name: str = "ccl"  # model/loss=ccl (conf/model/loss/ccl.yaml) chooses it
    margin: float = 0.9  # negatives whose cosine is below this cost nothing
    negative_weight: float = 150.0  # weight of the mean hinge over negatives
    mask_history: bool = False  # a candidate whose item is in the query's history bag is no negative

    def check(self, need, key: str) -> None:
        need(-1.0 <= self.margin < 1.0, f"{key}.margin", self.margin, "must be a cosine in [-1, 1)")
        need(self.negative_weight >= 0, f"{key}.negative_weight", self.negative_weight, "must be >= 0")

    def build(self) -> CosineContrastive:
        return CosineContrastive(self)


class CosineContrastive(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.margin, self.negative_weight = config.margin, config.negative_weight
        self.reads_query_history = config.mask_history  # RetrievalTask hands the batch's bags over when True

    def forward(
        self, queries, candidates, *, labels, query_item_ids, candidate_item_ids, log_q, unit_dims, query_history=None
    ):
        return cosine_contrastive_loss(
            queries,
            candidates,
            labels=labels,
            query_item_ids=query_item_ids,
            candidate_item_ids=candidate_item_ids,
            margin=self.margin,
            negative_weight=self.negative_weight,
            query_history=query_history,
        )


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward()
def cosine_contrastive_loss(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    *,
    labels: torch.Tensor,
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    margin: float,
    negative_weight: float,
    query_history: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The loss above for ``queries`` B_q x D against ``candidates`` C x D (unit-norm), ``labels`` B_q;
    ``query_history``: (lengths, items) of each query's bag, whose items are no negatives."""
    sims = torch.mm(queries, candidates.t()).float()  # fp32 past the GEMM under autocast (trainer.precision)
    rows = torch.arange(labels.numel(), device=labels.device)
    with torch.no_grad():
        excluded = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)  # the positive and its hits
        if query_history is not None:
            excluded |= QueryHistory.of(*query_history, candidate_item_ids).mask(0, labels.numel())
        excluded[rows, labels] = True
        num_negatives = (~excluded).sum(1).clamp_min(1)
    positive = sims[rows, labels]
    negative = torch.relu(sims - margin).masked_fill(excluded, 0.0).sum(1) / num_negatives
    return ((1.0 - positive) + negative_weight * negative).mean()
