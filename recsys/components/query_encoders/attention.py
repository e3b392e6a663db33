"""Attention pooling: the history's items weighed by a learned score, order-free (issue 55 item 3).

Each item of the history is looked up per position in the ``sequence`` table (as sasrec's are), scored by a
one-layer attention network and pooled by the softmax of the scores (Bahdanau-style additive attention, as in
DIN / NAIS without the candidate)::

    s_h = w . tanh(W e_h + b)          a_h = softmax_h(s_h) over the row's items      out = sum_h a_h e_h

A user without history gets a learned vector. The order of the items changes nothing, so a profile bag (a random
subset of the user's items, data.query_history=profile) is read as well as a recent history.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Config:
    name: str = "attention"  # model/query_encoder=attention (conf/model/query_encoder/attention.yaml) chooses it
    dim: int = 64  # columns of the sequence table = the pooled vector's width
    hidden: int = 64  # rows of W: the attention network's width

    @property
    def sequence(self) -> bool:
        return True

    @property
    def user(self) -> bool:
        return False  # the tower reads the user id (if any) beside it

    def check(self, need, key: str, data) -> None:
        need(
            data.history_length > 0,
            f"{key}.name",
            self.name,
            f"weighs the history's items: needs data.history_length > 0 (got {data.history_length})",
        )
        need(self.dim >= 1, f"{key}.dim", self.dim, "must be >= 1")
        need(self.hidden >= 1, f"{key}.hidden", self.hidden, "must be >= 1")

    def build(self, max_length: int, user_dim: int = 0) -> AttentionPooling:
        return AttentionPooling(self.dim, max_length, hidden=self.hidden)


class AttentionPooling(nn.Module):
    """``(items B x L x D, lengths B) -> B x D``: the attention-weighted sum of each row's first ``lengths[b]``
    items; a learned ``empty`` vector for rows without items."""

    def __init__(self, dim: int, max_length: int, *, hidden: int = 64) -> None:
        super().__init__()
        self.max_length = max_length
        self.project = nn.Linear(dim, hidden)  # W, b
        self.score = nn.Linear(hidden, 1, bias=False)  # w
        # the scale of the item rows (U(+-1/sqrt(num_items))), as sasrec's empty vector
        self.empty = nn.Parameter(torch.empty(dim).normal_(std=0.02))

    def forward(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        num_rows, length, _ = items.shape
        if length > self.max_length:
            raise ValueError(f"AttentionPooling: {length} positions, built for at most {self.max_length}")
        real = torch.arange(length, device=items.device)[None, :] < lengths[:, None]  # B x L
        scores = self.score(torch.tanh(self.project(items))).squeeze(-1)  # B x L
        # padded positions weigh nothing; an empty row keeps its (zero) position 0 so that its softmax is finite,
        # and is replaced by ``empty`` below
        keep = real.clone()
        keep[:, :1] = True
        weights = torch.softmax(scores.float().masked_fill(~keep, float("-inf")), dim=1).to(items.dtype)
        pooled = torch.einsum("bl,bld->bd", weights, items)
        return torch.where((lengths > 0)[:, None], pooled, self.empty.expand_as(pooled))
