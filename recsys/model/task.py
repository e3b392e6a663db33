"""Training task: in-batch softmax with logQ correction, mixed negatives and accidental-hit masking.

Scores s(u, i) = <q(u), c(i)> / tau - log q(i) over the candidates of the whole global batch
(every rank's positives, gathered) plus ``num_uniform_negatives`` uniformly sampled items shared
by the batch. q(i) is the probability that item i appears as a candidate under that mixture:

    q(i) = (B * p(i) + B' / N) / (B + B')      p(i): training frequency of i, B: global batch,
                                               B': uniform negatives, N: number of items

A candidate with the same item as a query's positive (other than the positive itself) is masked.
The loss is the mean cross-entropy over this rank's queries; with gathered candidates and
torchrec / DDP averaging gradients over ranks, N ranks follow the same curve as one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from recsys.data.batch import Batch
from recsys.model.in_batch_softmax import sampled_softmax_loss
from recsys.model.two_tower import TwoTower

# a leaf when TrainPipelineSparseDist traces forward(): fx patches the name in the globals of the module that
# registers it, so this module registers its own import (the decorator covers in_batch_softmax's own name only)
torch.fx.wrap("sampled_softmax_loss")


class LocalCandidates(nn.Module):
    """One process: the candidates are this rank's own. recsys.distributed swaps in a gather.

    forward(local candidates, global batch size, per-rank sizes or None) -> (candidates of every
    rank in rank order, offset of this rank's rows). A module, not a function, so that torch.fx (TrainPipelineSparseDist traces forward()
    to find the sparse inputs) treats it as a leaf instead of tracing into a collective.
    """

    world_size = 1

    def forward(
        self, t: torch.Tensor, global_size: int, sizes: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, int]:
        return t, 0


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
) -> torch.Tensor:
    """SimpleX's cosine contrastive loss (Mao et al., CIKM 2021), mean over queries:

        (1 - cos(q, c+)) + negative_weight * mean_j max(0, cos(q, c_j) - margin)

    over every other candidate j (accidental hits excluded). Queries and candidates are unit-norm,
    so the dot product is the cosine; no temperature and no logQ: negatives below the margin cost
    nothing, which is what lets many easy negatives in without drowning the hard ones.
    """
    sims = torch.mm(queries, candidates.t()).float()  # fp32 past the GEMM under autocast (trainer.precision)
    rows = torch.arange(labels.numel(), device=labels.device)
    with torch.no_grad():
        excluded = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)  # the positive and its hits
        excluded[rows, labels] = True
        num_negatives = (~excluded).sum(1).clamp_min(1)
    positive = sims[rows, labels]
    negative = torch.relu(sims - margin).masked_fill(excluded, 0.0).sum(1) / num_negatives
    return ((1.0 - positive) + negative_weight * negative).mean()


class RetrievalTask(nn.Module):
    def __init__(
        self,
        model: TwoTower,
        *,
        item_counts: torch.Tensor,
        temperature: float,
        logq_correction: bool,
        logq_weight: float = 1.0,
        num_uniform_negatives: int,
        loss: str = "softmax",
        margin: float = 0.9,
        negative_weight: float = 150.0,
        softmax_block_mb: int = -1,
    ) -> None:
        super().__init__()
        if loss not in ("softmax", "ccl"):
            raise ValueError(f"model.loss={loss!r}: expected 'softmax' or 'ccl'")
        self.loss, self.margin, self.negative_weight = loss, margin, negative_weight
        self.softmax_block_mb = softmax_block_mb
        self.model = model
        self.temperature = temperature
        self.logq_correction = logq_correction
        self.logq_weight = logq_weight
        self.num_uniform_negatives = num_uniform_negatives
        counts = item_counts.to(torch.float64)
        self.register_buffer("item_probs", (counts / counts.sum()).to(torch.float32), persistent=False)
        self.gather_candidates: nn.Module = LocalCandidates()

    def candidate_log_q(self, item_ids: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        num_items = self.item_probs.numel()
        b, b_neg = global_batch_size, self.num_uniform_negatives
        q = (b * self.item_probs[item_ids] + b_neg / num_items) / (b + b_neg)
        return torch.log(q.clamp_min(1e-12))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, its detached copy: the output TrainPipelineSparseDist hands back)."""
        n = batch.num_queries
        queries, candidates = self.model(batch.features, n)
        global_n = batch.global_num_queries
        gathered = self.gather_candidates(candidates[:n], global_n, batch.rank_sizes)
        positives, offset = gathered[0], gathered[1]  # indexing, not unpacking: fx-traceable
        positive_ids = self.gather_candidates(batch.candidate_item_ids[:n], global_n, batch.rank_sizes)[0]
        all_candidates = torch.cat([positives, candidates[n:]])
        all_ids = torch.cat([positive_ids, batch.candidate_item_ids[n:]])
        labels = torch.arange(offset, offset + n, device=queries.device)
        if self.loss == "ccl":
            loss = cosine_contrastive_loss(
                queries,
                all_candidates,
                labels=labels,
                query_item_ids=batch.candidate_item_ids[:n],
                candidate_item_ids=all_ids,
                margin=self.margin,
                negative_weight=self.negative_weight,
            )
        else:
            log_q = self.candidate_log_q(all_ids, positives.shape[0]) if self.logq_correction else None
            if log_q is not None and self.logq_weight != 1.0:
                log_q = log_q * self.logq_weight
            loss = sampled_softmax_loss(
                queries,
                all_candidates,
                labels=labels,
                query_item_ids=batch.candidate_item_ids[:n],
                candidate_item_ids=all_ids,
                temperature=self.temperature,
                candidate_log_q=log_q,
                block_mb=self.softmax_block_mb,
            )
        # Mean over this rank's queries, reweighted so that the ranks' average (what DDP and
        # torchrec's gradient division take) is the mean over the global batch, also when the
        # shares differ by a row: loss_r * n_r * W / N.
        loss = loss * (n * self.gather_candidates.world_size / global_n)
        return loss, loss.detach()
