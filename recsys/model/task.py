"""Training task: the candidates a loss sees, and their sampling probabilities for logQ.

The candidates are those of the whole global batch (every rank's positives, gathered) plus
``num_uniform_negatives`` uniformly sampled items shared by the batch; the loss (a component of
recsys/model/losses, e.g. the sampled softmax with s(u, i) = <q(u), c(i)> / tau - log q(i)) scores
each query against all of them. q(i) is the probability that item i appears as a candidate under
that mixture:

    q(i) = (B * p(i) + B' / N) / (B + B')      p(i): training frequency of i, B: global batch,
                                               B': uniform negatives, N: number of items

A candidate with the same item as a query's positive (other than the positive itself) is masked
by the loss. The loss is the mean over this rank's queries; with gathered candidates and
torchrec / DDP averaging gradients over ranks, N ranks follow the same curve as one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from recsys.data.batch import Batch
from recsys.model.two_tower import TwoTower


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


class RetrievalTask(nn.Module):
    def __init__(
        self,
        model: TwoTower,
        *,
        item_counts: torch.Tensor,
        loss: nn.Module,
        num_uniform_negatives: int,
    ) -> None:
        """``loss``: a loss component's module (recsys/model/losses: ``model.loss.build()``)."""
        super().__init__()
        self.model = model
        self.loss = loss
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
        loss = self.loss(
            queries,
            all_candidates,
            labels=labels,
            query_item_ids=batch.candidate_item_ids[:n],
            candidate_item_ids=all_ids,
            log_q=self.candidate_log_q(all_ids, positives.shape[0]),
        )
        # Mean over this rank's queries, reweighted so that the ranks' average (what DDP and
        # torchrec's gradient division take) is the mean over the global batch, also when the
        # shares differ by a row: loss_r * n_r * W / N.
        loss = loss * (n * self.gather_candidates.world_size / global_n)
        return loss, loss.detach()
