"""The unit the trainer consumes: one KJT for both towers plus the candidates' item ids."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class Batch(Pipelineable):
    """One rank's share of a global batch.

    ``features`` (one key per table, ``recsys.data.features``) has stride B + C, C = B + negatives::

        rows [0, B)          the queries (user, history and its categories)
        rows [B, 2B)         their positive items (candidate j is query j's positive)
        rows [2B, B + C)     uniform negatives shared by the whole global batch; identical on every rank

    ``candidate_item_ids[j]`` is the item of candidate j (used for logQ and accidental hits).
    ``global_num_queries`` is the size of the global batch this rank's share belongs to (0 when
    constructing: this batch is the whole global batch); ranks' shares may differ by one row.
    ``rank_sizes``: every rank's number of queries in this global batch, when they do not follow
    ``rank_shares(global_num_queries, world_size)`` (``data.shard_by_user``); None otherwise.
    ``history_lengths`` / ``history_items``: each query's history bag as dataset item indices (the KJT holds raw ids
    under model.id_mapping=managed), what the loss reads to mask a query's own items (model.loss.mask_history).
    """

    features: KeyedJaggedTensor
    candidate_item_ids: torch.Tensor  # S, int64
    num_queries: int
    global_num_queries: int = 0
    rank_sizes: tuple[int, ...] | None = None
    history_lengths: torch.Tensor | None = None  # B, int64
    history_items: torch.Tensor | None = None  # sum of history_lengths, int64

    def __post_init__(self) -> None:
        if self.global_num_queries == 0:
            self.global_num_queries = self.num_queries

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.candidate_item_ids, self.history_lengths, self.history_items) if t is not None)

    def _with(self, features: KeyedJaggedTensor, move) -> Batch:
        def optional(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else move(t)

        return Batch(
            features=features,
            candidate_item_ids=move(self.candidate_item_ids),
            num_queries=self.num_queries,
            global_num_queries=self.global_num_queries,
            rank_sizes=self.rank_sizes,
            history_lengths=optional(self.history_lengths),
            history_items=optional(self.history_items),
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        features = self.features.to(device=device, non_blocking=non_blocking)
        return self._with(features, lambda t: t.to(device=device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.features.record_stream(stream)
        for t in self._tensors():
            t.record_stream(stream)

    def pin_memory(self) -> Batch:
        return self._with(self.features.pin_memory(), lambda t: t.pin_memory())
