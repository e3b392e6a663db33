"""SimpleX's gated blend of the user-id embedding and the pooled history (Mao et al., CIKM 2021)::

    h = V pool(e_1 .. e_n)          g = sigmoid(a . [e_u; h] + c)          q_in = g e_u + (1 - g) h

The history's items are looked up per position in the ``sequence`` table (``dim`` columns) and pooled (``pool``:
their mean, or attention pooling as model/query_encoder=attention weighs them), mapped by V to the user table's
width, and blended with the user-id embedding e_u by a gate learned per query: a user with a long, telling history
leans on it, one the id says more about on the id. The blend takes the user id's place in the query tower's input
(the user key's pooled columns go through it, not beside it), so the user id is needed: model.query_user_id null
(which then resolves to true) or true.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from recsys.components.query_encoders.attention import AttentionPooling

POOLS = ("mean", "attention")  # model.query_encoder.pool


@dataclass
class Config:
    name: str = "gated"  # model/query_encoder=gated (conf/model/query_encoder/gated.yaml) chooses it
    dim: int = 64  # columns of the sequence table = the pooled history's width before V
    pool: str = "mean"  # mean | attention: how the history's items become one vector
    hidden: int = 64  # pool=attention: the attention network's width

    @property
    def sequence(self) -> bool:
        return True

    @property
    def user(self) -> bool:
        return True  # the blend reads the user-id embedding and takes its place in the tower's input

    def check(self, need, key: str, data) -> None:
        need(
            data.history_length > 0,
            f"{key}.name",
            self.name,
            f"blends the user id with the history: needs data.history_length > 0 (got {data.history_length})",
        )
        need(self.dim >= 1, f"{key}.dim", self.dim, "must be >= 1")
        need(self.pool in POOLS, f"{key}.pool", self.pool, f"choose one of {', '.join(POOLS)}")
        need(self.hidden >= 1, f"{key}.hidden", self.hidden, "must be >= 1")

    def build(self, max_length: int, user_dim: int) -> GatedBlend:
        pool = AttentionPooling(self.dim, max_length, hidden=self.hidden) if self.pool == "attention" else None
        return GatedBlend(self.dim, max_length, user_dim, pool=pool or MeanPooling(self.dim, max_length))


class MeanPooling(nn.Module):
    """``(items B x L x D, lengths B) -> B x D``: the mean of each row's first ``lengths[b]`` items; a learned
    ``empty`` vector for rows without items."""

    def __init__(self, dim: int, max_length: int) -> None:
        super().__init__()
        self.max_length = max_length
        self.empty = nn.Parameter(torch.empty(dim).normal_(std=0.02))

    def forward(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        real = torch.arange(items.shape[1], device=items.device)[None, :] < lengths[:, None]  # B x L
        mean = (items * real[..., None]).sum(1) / lengths.clamp(min=1)[:, None].to(items.dtype)
        return torch.where((lengths > 0)[:, None], mean, self.empty.expand_as(mean))


class GatedBlend(nn.Module):
    """``(items B x L x D, lengths B, user B x D_u) -> B x D_u``: ``g user + (1 - g) V pool(items)``, g in (0, 1) per
    row (the formula above)."""

    def __init__(self, dim: int, max_length: int, user_dim: int, *, pool: nn.Module) -> None:
        super().__init__()
        self.max_length = max_length
        self.pool = pool
        self.project = nn.Linear(dim, user_dim, bias=False)  # V
        self.gate = nn.Linear(2 * user_dim, 1)  # a, c

    def forward(self, items: torch.Tensor, lengths: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
        history = self.project(self.pool(items, lengths))
        g = torch.sigmoid(self.gate(torch.cat([user, history], dim=1)))  # B x 1
        return g * user + (1 - g) * history
