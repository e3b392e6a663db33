"""The sampled softmax over the batch's candidates (recsys/components/losses/in_batch_softmax.py).

Scores s(u, i) = <q(u), c(i)> / temperature - logq_weight * log q(i); the loss is the mean cross-entropy of each
query's positive against every candidate, accidental hits masked. logQ makes the sampled softmax an unbiased
estimate of the full softmax over the catalogue (Yi et al. 2019); ``logq_weight`` shifts the learned scores by
(w - 1) log q(i): < 1 favours tail items, > 1 head items. ``uniformity_weight`` > 0 adds that weight times the mean
uniformity of the queries and of their positives (recsys/components/losses/uniformity.py; DirectAU's term), which
spreads both over the sphere. ``mask_history`` masks a candidate whose item is in the query's own history bag, as an
accidental hit (recsys/components/losses/candidate_hits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from recsys.components.losses.in_batch_softmax import sampled_softmax_loss
from recsys.components.losses.uniformity import uniformity

# a leaf when TrainPipelineSparseDist traces forward(): fx patches the name in the globals of the module that calls it
torch.fx.wrap("sampled_softmax_loss")


@dataclass
class Config:
    name: str = "softmax"  # model/loss=softmax (conf/model/loss/softmax.yaml) chooses it
    temperature: float = 0.1  # tau: scores are <q, c> / tau (the sweep that chose 0.1: docs/quality.md)
    logq_correction: bool = True  # subtract log q(i), the probability that candidate i is sampled
    logq_weight: float = 1.0  # the correction's weight: 1 = the unbiased estimate
    # MiB of fp32 logits computed at once: a batch whose B x C logits exceed it runs in row blocks of queries (the same
    # loss and gradients, memory B_block x C); -1 = auto (64 on CPU, 1024 on a GPU), 0 = dense
    block_mb: int = -1
    # + weight x the uniformity of the queries and of their positives (DirectAU); 0 = the softmax alone
    uniformity_weight: float = 0.0
    # a candidate whose item is in the query's history bag is no negative (masked as an accidental hit; the measures:
    # docs/quality.md, "The query's own items as negatives")
    mask_history: bool = True

    def check(self, need, key: str) -> None:
        need(self.temperature > 0, f"{key}.temperature", self.temperature, "must be > 0 (scores are divided by it)")
        need(self.uniformity_weight >= 0, f"{key}.uniformity_weight", self.uniformity_weight, "must be >= 0")
        need(self.block_mb >= -1, f"{key}.block_mb", self.block_mb, "must be -1 (auto), 0 (dense) or MiB")

    def build(self) -> SampledSoftmax:
        return SampledSoftmax(self)


class SampledSoftmax(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.temperature, self.block_mb = config.temperature, config.block_mb
        self.logq_correction, self.logq_weight = config.logq_correction, config.logq_weight
        self.uniformity_weight = config.uniformity_weight
        self.reads_query_history = config.mask_history  # RetrievalTask hands the batch's bags over when True

    def forward(
        self, queries, candidates, *, labels, query_item_ids, candidate_item_ids, log_q, unit_dims, query_history=None
    ):
        if not self.logq_correction:
            log_q = None
        elif self.logq_weight != 1.0:
            log_q = log_q * self.logq_weight
        loss = sampled_softmax_loss(
            queries,
            candidates,
            labels=labels,
            query_item_ids=query_item_ids,
            candidate_item_ids=candidate_item_ids,
            temperature=self.temperature,
            candidate_log_q=log_q,
            block_mb=self.block_mb,
            query_history=query_history,
        )
        if not self.uniformity_weight:
            return loss
        spread = uniformity(queries[:, :unit_dims]) + uniformity(candidates[labels][:, :unit_dims])
        return loss + self.uniformity_weight * spread / 2
