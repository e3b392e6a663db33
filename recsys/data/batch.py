"""The unit the trainer consumes: one KJT for both towers plus the candidates' item ids."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class Batch(Pipelineable):
    """One rank's share of a global batch.

    Row layout of ``features`` (stride S = num_queries + num_negatives)::

        rows [0, num_queries)   query features and that query's positive item (candidate features)
        rows [num_queries, S)   uniform negatives shared by the whole global batch (candidate
                                features only); identical on every rank

    ``candidate_item_ids[j]`` is the item of candidate row j (used for logQ and accidental hits).
    """

    features: KeyedJaggedTensor
    candidate_item_ids: torch.Tensor  # S, int64
    num_queries: int

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(
            features=self.features.to(device=device, non_blocking=non_blocking),
            candidate_item_ids=self.candidate_item_ids.to(device=device, non_blocking=non_blocking),
            num_queries=self.num_queries,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.features.record_stream(stream)
        self.candidate_item_ids.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(
            features=self.features.pin_memory(),
            candidate_item_ids=self.candidate_item_ids.pin_memory(),
            num_queries=self.num_queries,
        )
