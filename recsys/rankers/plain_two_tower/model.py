"""A textbook two-tower, written in plain PyTorch as a baseline for the framework's own: a user-id and an item-id
embedding table, both rows L2-normalised, scored <u, i> / τ, trained with the in-batch softmax over shuffled
(user, item) rows (each row's negatives: the batch's other items, its own item's repeats masked), the logits
corrected by each item's log sampling probability (logQ, Yi et al. 2019: without it, on a 2,000-item Gowalla sample,
valid Recall@20 0.311 against 0.362; docs/quality.md), by Adam. No history bag, no graph: what the framework's own
two-tower is measured against as the "tuned plain two-tower"."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from recsys.ranking.interactions import UserItemCSR

Tables = tuple[torch.Tensor, torch.Tensor]  # (users float32 [U, D], items float32 [I, D]), rows of unit norm


def train_plain_two_tower(
    graph: UserItemCSR,
    *,
    dim: int,
    temperature: float,
    lr: float,
    epochs: Sequence[int],
    batch_size: int = 1024,
    logq_correction: bool = True,
    seed: int = 0,
) -> dict[int, Tables]:
    """The normalised tables after each of ``epochs`` (one training to the largest), trained on ``graph``'s rows."""
    gen = torch.Generator().manual_seed(seed)
    users = torch.nn.Embedding(graph.num_users, dim, sparse=True)
    items = torch.nn.Embedding(graph.num_items, dim, sparse=True)
    for table in (users, items):
        torch.nn.init.normal_(table.weight, std=0.1, generator=gen)
    opt = torch.optim.SparseAdam([users.weight, items.weight], lr=lr)
    row_user = torch.from_numpy(np.repeat(np.arange(graph.num_users), np.diff(graph.indptr)))
    row_item = torch.from_numpy(graph.indices)
    # an item's chance of being a batch's row: its share of the rows (the batches are uniform draws of them)
    counts = torch.bincount(row_item, minlength=graph.num_items).double()
    log_q = torch.log(counts / graph.nnz).float() if logq_correction else None
    marks, out = sorted(set(int(e) for e in epochs)), {}
    for epoch in range(1, marks[-1] + 1):
        order = torch.randperm(graph.nnz, generator=gen)
        for start in range(0, graph.nnz - 1, batch_size):
            rows = order[start : start + batch_size]
            if rows.numel() < 2:
                break
            item_ids = row_item[rows]
            batch_q = None if log_q is None else log_q[item_ids]
            loss = _in_batch_softmax(users(row_user[rows]), items(item_ids), item_ids, temperature, batch_q)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if epoch in marks:
            with torch.no_grad():
                out[epoch] = (F.normalize(users.weight, dim=1).clone(), F.normalize(items.weight, dim=1).clone())
    return out


def _in_batch_softmax(
    u: torch.Tensor, i: torch.Tensor, item_ids: torch.Tensor, temperature: float, log_q: torch.Tensor | None = None
) -> torch.Tensor:
    """The mean cross-entropy of each row's item among the batch's, ``log_q`` [B] (each column item's log sampling
    probability) subtracted from every row's logits."""
    logits = F.normalize(u, dim=1) @ F.normalize(i, dim=1).t() / temperature
    if log_q is not None:
        logits = logits - log_q[None, :]
    same_item = item_ids[:, None] == item_ids[None, :]
    same_item.fill_diagonal_(False)  # a repeat of the row's own item is not a negative
    logits = logits.masked_fill(same_item, float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(item_ids)))
