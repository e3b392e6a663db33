"""Evaluation of the sharded two-tower: embed on every rank, then rank and score (``rank_and_score``).

Protocol: every item is a candidate; for the valid split a user's training items are masked,
for the test split their training and validation items; a user's query history is their latest
items in the splits before the evaluated one. Every rank embeds a share of users and items (the
sharded lookups are collective), the embeddings are gathered, and rank 0 ranks and scores.

With ``per_rank_users`` (``data.shard_by_user``: each rank holds its own users' rows only) every
rank embeds and ranks its own users against all items (item embeddings are gathered), and the
metrics are combined across ranks: per-user sums and counts, and the items in any top-K.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from recsys.data.batch import Batch
from recsys.data.batch_bounds import ceil_div
from recsys.data.dataset import Interactions, RetrievalData
from recsys.data.eval_batches import item_batches, query_batches
from recsys.data.feature_builder import FeatureBuilder
from recsys.distributed.collectives import all_gather_rows
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import PER_USER_METRICS, per_user_metrics
from recsys.ranking.scoring import TRAINED_ROW, rank_and_score
from recsys.ranking.untrained import unranked_items

PRECEDING_SPLITS = {"valid": ("train",), "test": ("train", "valid")}


def sample_users(users: np.ndarray, max_users: int, seed: int) -> np.ndarray:
    """``users`` (ascending) if ``max_users`` is 0 or not fewer; else a seeded uniform sample of ``max_users`` of them, ascending."""
    if max_users < 0:
        raise ValueError(f"max_users must be >= 0 (0 = every user), got {max_users}")
    if max_users == 0 or len(users) <= max_users:
        return users
    return np.sort(np.random.default_rng(seed).choice(users, size=max_users, replace=False))


def _rank_share(n: int, rank: int, world_size: int) -> slice:
    per_rank = ceil_div(n, world_size)
    return slice(min(n, rank * per_rank), min(n, (rank + 1) * per_rank))


def _lockstep(batches: Iterator[Batch], num_steps: int, filler: Batch) -> Iterator[tuple]:
    """Yield exactly ``num_steps`` (batch, is_real) pairs: sharded lookups need every rank."""
    it = iter(batches)
    for _ in range(num_steps):
        batch = next(it, None)
        yield (filler, False) if batch is None else (batch, True)


@torch.no_grad()
def embed(
    two_tower: nn.Module,
    builder: FeatureBuilder,
    *,
    side: str,
    ids: np.ndarray,
    timeline: Interactions | None,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    local: bool = False,
) -> torch.Tensor:
    """Embeddings of ``ids`` (users for side="query", items for side="candidate"), ``len(ids) x D``, on every rank.

    ``local=True``: ``ids`` are this rank's own (they differ between ranks); each rank embeds all of
    its ids and gets only their embeddings back (the ranks still step together).
    """
    if local:
        share = ids
        num_steps = _max_over_ranks(ceil_div(len(ids), batch_size), device, world_size)
    else:
        share = ids[_rank_share(len(ids), rank, world_size)]
        num_steps = ceil_div(ceil_div(len(ids), world_size), batch_size)  # the same on every rank
    real = len(share)
    if not local and world_size > 1 and getattr(two_tower, "mc_ebc", None) is not None:
        # row-wise sharded (managed) tables pool every rank's rows and scatter them back in equal blocks: every
        # rank's batches must be the same size, so the shorter shares are padded with id 0 (dropped below)
        share = np.concatenate([share, np.zeros(ceil_div(len(ids), world_size) - real, dtype=share.dtype)])
    some_id = np.zeros(1, dtype=np.int64)  # a filler batch for ranks out of ids (user / item 0 always exists)
    if side == "query":
        batches = query_batches(builder, share, timeline, batch_size)
        filler = next(query_batches(builder, some_id, timeline, 1))
    else:
        batches = item_batches(builder, share, batch_size)
        filler = next(item_batches(builder, some_id, 1))
    out: list[torch.Tensor] = []
    dim = 0  # a rank whose share is empty still runs the filler batches, which give D
    for batch, is_real in _lockstep(batches, num_steps, filler):
        batch = batch.to(device)
        queries, candidates = two_tower(batch.features, batch.num_queries)
        embeddings = queries if side == "query" else candidates
        dim = embeddings.shape[1]
        if is_real:
            out.append(embeddings.float().cpu())
    mine = torch.cat(out)[:real] if out else torch.zeros(0, dim)
    return mine if local else all_gather_rows(mine, world_size, device=device)  # NCCL gathers on the GPU


def _max_over_ranks(value: int, device: torch.device, world_size: int) -> int:
    if world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def metrics_over_ranks(
    topk_ids: np.ndarray,
    relevant: UserItemCSR,
    ks: Sequence[int],
    *,
    num_items: int,
    device: torch.device,
    world_size: int,
) -> dict[str, float]:
    """``compute_metrics`` over the union of every rank's users, each rank passing its own rows.

    Means are sums over the evaluated users of all ranks / their number (all-reduced in float64);
    coverage@K counts the items in any rank's top K. Equal to ``compute_metrics`` on the
    concatenated rows up to float rounding.
    """
    evaluated = relevant.lengths() > 0
    per_user = per_user_metrics(topk_ids, relevant, ks)
    names = [f"{name}@{k}" for k in ks for name in PER_USER_METRICS]
    sums = torch.tensor(
        [float(per_user[n][evaluated].sum()) for n in names] + [float(evaluated.sum())], dtype=torch.float64
    )
    covered = torch.zeros(len(ks), num_items, dtype=torch.uint8)
    top = np.asarray(topk_ids)[evaluated]
    for j, k in enumerate(ks):
        ids = top[:, :k]
        covered[j, torch.from_numpy(ids[ids >= 0])] = 1
    if world_size > 1:
        sums, covered = sums.to(device), covered.to(device)
        dist.all_reduce(sums)
        dist.all_reduce(covered, op=dist.ReduceOp.MAX)
        sums, covered = sums.cpu(), covered.cpu()
    count = float(sums[-1])
    out: dict[str, float] = {}
    for j, k in enumerate(ks):
        for name in PER_USER_METRICS:
            out[f"{name}@{k}"] = float(sums[names.index(f"{name}@{k}")]) / count if count else float("nan")
        out[f"coverage@{k}"] = float(covered[j].sum()) / num_items
    out["num_users_evaluated"] = count
    return out


class Evaluator:
    """Evaluates the valid or test split: the ranking and metrics run on rank 0 and are broadcast,
    or, with ``per_rank_users``, on every rank for its own users, the metrics combined across ranks."""

    def __init__(
        self,
        data: RetrievalData,
        builder: FeatureBuilder,
        *,
        ks: Sequence[int],
        batch_size: int,
        chunk_size: int,
        per_rank_users: bool = False,
    ) -> None:
        self.data, self.builder = data, builder
        self.ks, self.batch_size, self.chunk_size = list(ks), batch_size, chunk_size
        self.per_rank_users = per_rank_users

    def csr(self, split: Interactions) -> UserItemCSR:
        """A split's (user, item) pairs as a CSR over every user of the dataset."""
        return UserItemCSR.from_pairs(
            split.user_ids, split.item_ids, num_users=self.data.num_users, num_items=self.data.num_items
        )

    def protocol(self, split: str, *, max_users: int = 0, seed: int = 0) -> SplitProtocol:
        """The evaluated users of a split, their relevant and excluded items, and the history timeline.

        ``max_users > 0``: at most that many users, a uniform sample without replacement drawn
        from ``seed`` (ascending ids; the same sample on every rank and every run).
        """
        target = self.data.splits[split]
        users = sample_users(np.unique(target.user_ids), max_users, seed)
        before = [self.data.splits[s] for s in PRECEDING_SPLITS[split]]
        timeline = before[0] if len(before) == 1 else Interactions.concat(*before)
        relevant = self.csr(target).select_rows(users)
        exclude = self.csr(timeline).select_rows(users)
        return SplitProtocol(users, relevant, exclude, timeline)

    def embeddings(
        self, two_tower: nn.Module, split: str, *, device: torch.device, rank: int = 0, world_size: int = 1
    ) -> tuple[SplitProtocol, torch.Tensor, torch.Tensor]:
        """Collective: (the split's protocol, its users' query embeddings [U, D], every item's embedding [I, D]);
        with ``per_rank_users`` the users (and their embeddings) are this rank's own."""
        protocol = self.protocol(split)
        common = dict(batch_size=self.batch_size, device=device, rank=rank, world_size=world_size)
        was_training = two_tower.training
        two_tower.eval()
        try:
            user_emb = embed(
                two_tower, self.builder, side="query", ids=protocol.users, timeline=protocol.timeline,
                local=self.per_rank_users, **common,
            )  # fmt: skip
            item_emb = embed(
                two_tower, self.builder, side="candidate", ids=np.arange(self.data.num_items), timeline=None, **common
            )
        finally:
            two_tower.train(was_training)
        return protocol, user_emb, item_emb

    def evaluate(
        self,
        two_tower: nn.Module,
        split: str,
        *,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> dict[str, dict[str, float]]:
        """``{"two_tower": metrics}`` of ``split`` (the per-epoch validation), the same on every rank; the
        rankers after training are ``recsys.job.run_stage``'s. With managed tables the items they do not
        hold are left out, as the evaluation stage leaves them out (recsys/ranking/untrained.py), so the epoch
        chosen on valid is chosen on the ranking the run reports."""
        return self.evaluate_users(two_tower, split, device=device, rank=rank, world_size=world_size).metrics

    def evaluate_users(
        self,
        two_tower: nn.Module,
        split: str,
        *,
        metric: str | None = None,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> SplitFigures:
        """``evaluate``'s metrics and, for ``metric`` (a per-user one, e.g. "recall@20"), every evaluated user's
        figure (all ranks' users, on every rank): a search compares two trials user by user (recsys/tune/)."""
        protocol, user_emb, item_emb = self.embeddings(
            two_tower, split, device=device, rank=rank, world_size=world_size
        )
        # never-trained items of managed tables, left out as the evaluation stage leaves them out
        unranked = unranked_items(self.data, two_tower, device=device, world_size=world_size)
        score = dict(
            exclude=protocol.exclude,
            relevant=protocol.relevant,
            ks=self.ks,
            chunk_size=self.chunk_size,
            unranked=unranked,
        )
        per_user = metric is not None and metric.partition("@")[0] in PER_USER_METRICS
        if self.per_rank_users:  # every rank ranks its own users; the metrics are combined across ranks
            ranked, metrics = rank_and_score(
                user_emb,
                item_emb,
                max(self.ks),
                **score,
                score=partial(metrics_over_ranks, device=device, world_size=world_size),
            )
            if not per_user:
                return SplitFigures(metrics, None, None)
            users, figures = _users_figures(ranked, protocol, self.ks, metric)
            if world_size > 1:
                shares: list[Any] = [None] * world_size
                dist.all_gather_object(shares, (users, figures))
                users, figures = (np.concatenate(parts) for parts in zip(*shares))
                order = np.argsort(users, kind="stable")
                users, figures = users[order], figures[order]
            return SplitFigures(metrics, users, figures)
        results: list[Any] = [None]
        if rank == 0:
            ranked, metrics = rank_and_score(user_emb, item_emb, max(self.ks), **score)
            figures = _users_figures(ranked, protocol, self.ks, metric) if per_user else (None, None)
            results[0] = SplitFigures(metrics, *figures)
        if world_size > 1:
            dist.broadcast_object_list(results, src=0)
        assert results[0] is not None
        return results[0]


class SplitFigures(NamedTuple):
    """``Evaluator.evaluate_users``: the metrics, and one metric's figure per evaluated user (None if not asked)."""

    metrics: dict[str, dict[str, float]]
    users: np.ndarray | None  # int64, ascending: the users with a held-out item in the split
    figures: np.ndarray | None  # float64, each user's figure; their mean is metrics' figure (float order aside)


def _users_figures(ranked, protocol: SplitProtocol, ks: Sequence[int], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(the evaluated users, their ``metric``) of this process's ranking of the trained model."""
    ids = ranked[TRAINED_ROW][1].cpu().numpy()
    evaluated = protocol.relevant.lengths() > 0
    return protocol.users[evaluated], per_user_metrics(ids, protocol.relevant, ks)[metric][evaluated]


class SplitProtocol(NamedTuple):
    """What ``Evaluator.protocol`` gives for a split, rows in the order of ``users``."""

    users: np.ndarray  # int64 [U], ascending: the evaluated users
    relevant: UserItemCSR  # [U rows, I]: each user's held-out items of the split
    exclude: UserItemCSR  # [U rows, I]: the items of the preceding splits, never ranked
    timeline: Interactions  # the preceding splits' interactions (the users' query histories)
