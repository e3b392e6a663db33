"""Training task: the candidates a loss sees, and their sampling probabilities for logQ.

The candidates are those of the whole global batch (every rank's positives, gathered) plus
``model.negatives.num`` sampled items shared by the batch; the loss (a component of
recsys/model/losses, e.g. the sampled softmax with s(u, i) = <q(u), c(i)> / tau - log q(i)) scores
each query against all of them. q(i) is the probability that item i appears as a candidate under
that mixture:

    q(i) = (B * p(i) + B' * s(i)) / (B + B')   p(i): training frequency of i, B: global batch,
                                               B': sampled negatives (model.negatives.num), s(i): the
                                               distribution they are drawn from (1 / N: uniform)

With model.negatives.num = -1 the candidates are the whole catalogue instead, each item once: a full
softmax, no sampling and so no logQ.

A candidate with the same item as a query's positive (other than the positive itself) is masked
by the loss, and one whose item is in the query's history bag where the loss reads the bags
(model.loss.mask_history). The loss is the mean over this rank's queries; with gathered candidates and
torchrec / DDP averaging gradients over ranks, N ranks follow the same curve as one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from recsys.data.batch import Batch
from recsys.data.negatives import WHOLE_CATALOGUE
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
        num_negatives: int,
        negative_exponent: float = 0.0,
    ) -> None:
        """``loss``: a loss component's module (recsys/model/losses: ``model.loss.build()``). ``num_negatives``,
        ``negative_exponent``: model.negatives (recsys/data/negatives.py; -1: the whole catalogue, a full softmax)."""
        super().__init__()
        self.model = model
        self.loss = loss
        # with model.item_bias the candidates' last column is the item's bias, the queries' a constant 1
        self.bias_columns = int(getattr(model, "item_bias", False))
        self.whole_catalogue = num_negatives == WHOLE_CATALOGUE
        self.num_negatives = max(num_negatives, 0)
        counts = item_counts.to(torch.float64)
        self.register_buffer("item_probs", (counts / counts.sum()).to(torch.float32), persistent=False)
        # the negatives' own distribution s(i) when not uniform (uniform keeps the exact B'/N of earlier runs)
        probs = None
        if negative_exponent and not self.whole_catalogue:  # recsys.data.negatives.sampling_probs' formula
            weights = counts**negative_exponent
            probs = (weights / weights.sum()).to(torch.float32)
        self.register_buffer("negative_probs", probs, persistent=False)
        self.gather_candidates: nn.Module = LocalCandidates()

    def candidate_log_q(self, item_ids: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        """log q(i) of each candidate: q(i) = (B p(i) + B' s(i)) / (B + B'), the module docstring's mixture."""
        b, b_neg = global_batch_size, self.num_negatives
        share = (
            b_neg / self.item_probs.numel() if self.negative_probs is None else b_neg * self.negative_probs[item_ids]
        )
        q = (b * self.item_probs[item_ids] + share) / (b + b_neg)
        return torch.log(q.clamp_min(1e-12))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, its detached copy: the output TrainPipelineSparseDist hands back)."""
        n = batch.num_queries
        queries, candidates = self.model(batch.features, n)
        global_n = batch.global_num_queries
        if self.whole_catalogue:
            return self._scaled(self._full_softmax(batch, queries, candidates), n, global_n)
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
            unit_dims=queries.shape[1] - self.bias_columns,
            **self._history_of(batch),
        )
        return self._scaled(loss, n, global_n)

    def _history_of(self, batch: Batch) -> dict:
        """The queries' history bags for a loss that masks them (``reads_query_history``), else nothing."""
        if not getattr(self.loss, "reads_query_history", False):
            return {}
        if batch.history_lengths is None or batch.history_items is None:
            raise ValueError(
                "model.loss.mask_history=true: this batch carries no history bags (Batch.history_lengths / "
                "history_items, which recsys.data.feature_builder.FeatureBuilder fills)"
            )
        return {"query_history": (batch.history_lengths, batch.history_items)}

    def _full_softmax(self, batch: Batch, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """The loss against the whole catalogue: the batch's negatives are every item in item order (rows [n, n + I)),
        so a query's positive is its item's row; the in-batch positives (rows [0, n)) are not used, and nothing is
        sampled, so no logQ (a zero row)."""
        n = batch.num_queries
        catalogue_ids = batch.candidate_item_ids[n:]
        return self.loss(
            queries,
            candidates[n:],
            labels=batch.candidate_item_ids[:n],
            query_item_ids=batch.candidate_item_ids[:n],
            candidate_item_ids=catalogue_ids,
            log_q=torch.zeros(catalogue_ids.shape, dtype=queries.dtype, device=queries.device),
            unit_dims=queries.shape[1] - self.bias_columns,
            **self._history_of(batch),
        )

    def _scaled(self, loss: torch.Tensor, n: int, global_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean over this rank's queries, reweighted so that the ranks' average (what DDP and torchrec's gradient
        division take) is the mean over the global batch, also when the shares differ by a row: loss_r * n_r * W / N."""
        loss = loss * (n * self.gather_candidates.world_size / global_n)
        return loss, loss.detach()
