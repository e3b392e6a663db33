"""SASRec-style query encoder: the user's recent items, in order, through pre-LN transformer blocks.

Kang & McAuley 2018 (SASRec), read as a query tower of a two-tower model (``model/query_encoder=sasrec``:
recsys/components/query_encoders/sasrec.py): the history's items are looked up per position (unpooled, from the
``sequence`` table of an EmbeddingCollection; recsys.model.two_tower), a learned embedding of each item's recency
is added, and the newest item's output after ``num_layers`` blocks is the sequence's summary.

Shapes (B queries, L = data.history_length, D = model.query_encoder.dim)::

    jagged history (oldest -> newest)  --padded_history-->  items B x L x D, lengths B
    row b: [i_0, i_1, ..., i_{n-1}, pad, ..., pad]        n = lengths[b] <= L
    recency of position p: n - 1 - p (the newest item is 0), so a row's inputs do not depend on L
    SequenceEncoder(items, lengths) -> B x D: position n - 1's output (a learned vector when n = 0)

Padding never changes a query: padded positions are masked as attention keys, every block is
per-position otherwise, and only a real position's output is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # the serving bundle builds these modules without torchrec
    from torchrec.sparse.jagged_tensor import JaggedTensor


def padded_history(history: JaggedTensor, num_rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [0, num_rows) of an unpooled lookup (values ``N x D``) as ``num_rows x length x D``, zeros after each
    row's items, and their lengths (``num_rows``, int64). Rows past ``num_rows`` must be empty (candidate rows)."""
    lengths = history.lengths().long()
    values = history.values()
    row_lengths = lengths[:num_rows]
    if lengths.numel() > num_rows and bool((lengths[num_rows:] != 0).any()):
        raise ValueError("padded_history: rows past the queries carry sequence ids (expected only query rows)")
    return padded_rows(values, torch.cumsum(row_lengths, 0) - row_lengths, row_lengths, length)


def padded_rows(
    values: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b's items ``values[starts[b] : starts[b] + lengths[b]]`` (values ``N x D``) as ``B x length x D``, zeros
    after them, and the lengths cut to ``length``; a longer row keeps its oldest ``length`` (the batch builders and
    the serving bundle already cut histories). One gather, no data-dependent shape: what the serving bundle's
    query encoder (recsys/rankers/two_tower/query_encoder.py) and torch.export also run."""
    lengths = lengths.clamp(max=length)
    positions = torch.arange(length, device=values.device)
    real = positions[None, :] < lengths[:, None]
    # a padded position reads the zero row appended after the values
    index = torch.where(real, starts[:, None] + positions[None, :], values.shape[0])
    return torch.cat([values, values.new_zeros(1, values.shape[-1])])[index], lengths


class SequenceEncoder(nn.Module):
    """``(items B x L x D, lengths B) -> B x D``: recency embeddings, ``num_layers`` pre-LN blocks, a final LayerNorm,
    the last real position's output; a learned ``empty`` vector for rows without items."""

    def __init__(
        self, dim: int, max_length: int, *, num_layers: int = 2, num_heads: int = 1, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.max_length = max_length
        self.recency = nn.Embedding(max_length, dim)
        nn.init.normal_(self.recency.weight, std=0.02)  # the scale of the item rows (U(+-1/sqrt(num_items)))
        self.dropout = nn.Dropout(dropout)
        # SASRec's point-wise feed-forward is D -> D -> D
        block = nn.TransformerEncoderLayer(
            dim, num_heads, dim_feedforward=dim, dropout=dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.empty = nn.Parameter(torch.empty(dim).normal_(std=0.02))

    def forward(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        num_rows, length, _ = items.shape
        if num_rows == 0:  # candidate-only batches (embedding the items): attention cannot take an empty batch
            return self.empty[None, :].expand(0, -1)
        if length > self.max_length:
            raise ValueError(f"SequenceEncoder: {length} positions, built for at most {self.max_length}")
        position = torch.arange(length, device=items.device)
        real = position[None, :] < lengths[:, None]  # B x L
        recency = (lengths[:, None] - 1 - position[None, :]).clamp(min=0)
        x = self.dropout(items + self.recency(recency)) * real[..., None]
        # a row without items keeps position 0 as a key, so that no attention row is all -inf (NaN, which
        # would reach the gradients through softmax's backward); its output is replaced by ``empty`` below
        padding = ~real
        padding[:, 0] = False
        x = self.norm(self.blocks(x, src_key_padding_mask=padding))
        last = x[torch.arange(num_rows, device=items.device), (lengths - 1).clamp(min=0)]
        return torch.where((lengths > 0)[:, None], last, self.empty.expand_as(last))
