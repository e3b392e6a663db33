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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from recsys.data.batch import Batch
from recsys.model.two_tower import TwoTower

class LocalCandidates(nn.Module):
    """One process: the candidates are this rank's own. recsys.distributed swaps in a gather.

    forward(local candidates, global batch size) -> (candidates of every rank in rank order,
    offset of this rank's rows). A module, not a function, so that torch.fx (TrainPipelineSparseDist traces forward()
    to find the sparse inputs) treats it as a leaf instead of tracing into a collective.
    """

    world_size = 1

    def forward(self, t: torch.Tensor, global_size: int) -> Tuple[torch.Tensor, int]:
        return t, 0


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward(): it assigns into a mask
def sampled_softmax_loss(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    *,
    labels: torch.Tensor,
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    temperature: float,
    candidate_log_q: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of each query against all candidates.

    queries ``B_q x D``; candidates ``C x D``; labels ``B_q`` (column of each positive);
    query_item_ids ``B_q``; candidate_item_ids ``C``; candidate_log_q ``C`` or None.
    Returns (mean loss, logits ``B_q x C`` after correction and masking).
    """
    # B_q x C passes done in place on the matmul's output: none of mm / div / sub / masked_fill
    # needs its output for backward, and a fresh B_q x C tensor costs an allocation whose pages
    # fault in one by one (8192 x 8192 floats = 256 MiB); same values, bit for bit
    logits = torch.mm(queries, candidates.t()).div_(temperature)
    if candidate_log_q is not None:
        logits.sub_(candidate_log_q.unsqueeze(0))
    hits = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)
    hits[torch.arange(labels.numel(), device=labels.device), labels] = False
    logits.masked_fill_(hits, float("-inf"))
    return F.cross_entropy(logits, labels), logits


class RetrievalTask(nn.Module):
    def __init__(
        self,
        model: TwoTower,
        *,
        item_counts: torch.Tensor,
        temperature: float,
        logq_correction: bool,
        num_uniform_negatives: int,
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.logq_correction = logq_correction
        self.num_uniform_negatives = num_uniform_negatives
        counts = item_counts.to(torch.float64)
        self.register_buffer("item_probs", (counts / counts.sum()).to(torch.float32), persistent=False)
        self.gather_candidates: nn.Module = LocalCandidates()

    def candidate_log_q(self, item_ids: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        num_items = self.item_probs.numel()
        b, b_neg = global_batch_size, self.num_uniform_negatives
        q = (b * self.item_probs[item_ids] + b_neg / num_items) / (b + b_neg)
        return torch.log(q.clamp_min(1e-12))

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        n = batch.num_queries
        queries, candidates = self.model(batch.features, n)
        global_n = batch.global_num_queries
        gathered = self.gather_candidates(candidates[:n], global_n)
        positives, offset = gathered[0], gathered[1]  # indexing, not unpacking: fx-traceable
        positive_ids = self.gather_candidates(batch.candidate_item_ids[:n], global_n)[0]
        all_candidates = torch.cat([positives, candidates[n:]])
        all_ids = torch.cat([positive_ids, batch.candidate_item_ids[n:]])
        labels = torch.arange(offset, offset + n, device=queries.device)
        log_q = self.candidate_log_q(all_ids, positives.shape[0]) if self.logq_correction else None
        loss, logits = sampled_softmax_loss(
            queries,
            all_candidates,
            labels=labels,
            query_item_ids=batch.candidate_item_ids[:n],
            candidate_item_ids=all_ids,
            temperature=self.temperature,
            candidate_log_q=log_q,
        )
        # Mean over this rank's queries, reweighted so that the ranks' average (what DDP and
        # torchrec's gradient division take) is the mean over the global batch, also when the
        # shares differ by a row: loss_r * n_r * W / N.
        loss = loss * (n * self.gather_candidates.world_size / global_n)
        return loss, (loss.detach(), logits.detach(), labels.detach())
