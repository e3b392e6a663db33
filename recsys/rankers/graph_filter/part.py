"""The graph filter as the bundle serves it: a query is the sum of ``query_table``'s rows over the user's distinct
items (a sum-pooled bag: recsys/rankers/graph_filter/ranker.py), ranked against its item vectors. Files::

    items.npy          float32 [I, m + k]: the filter's item vectors at the chosen sharpening time
    query_table.npy    float32 [I, m + k]: row j is what item j adds to a query, at the chosen low-pass weight
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recsys.rankers.parts import Catalogue, Query, ServedPart, register_part
from recsys.utils.safe_load import numpy_load


@register_part
class GraphFilterPart(ServedPart):
    ranker = "graph_filter"
    reads_users = False  # a query is its items

    def __init__(self, items: torch.Tensor, *, query_table: torch.Tensor, unranked: torch.Tensor | None = None) -> None:
        super().__init__(items, unranked)
        self.query_table = query_table.float().contiguous()

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        """float32 [B, m + k]: each query's items' rows summed, each item once; items the catalogue lacks add
        nothing."""
        lengths = np.asarray(query.lengths, dtype=np.int64)
        items = np.asarray(query.items, dtype=np.int64)
        users = np.repeat(np.arange(len(lengths)), lengths)
        known = items >= 0
        users, items = users[known], items[known]
        keys = np.unique(users * catalogue.num_items + items)  # a user's item counts once (a binary row)
        users, items = keys // catalogue.num_items, keys % catalogue.num_items
        out = torch.zeros(len(lengths), self.query_table.shape[1])
        out.index_add_(0, torch.from_numpy(users), self.query_table[torch.from_numpy(items)])
        return out

    def save_own(self, folder: Path) -> dict:
        np.save(folder / "query_table.npy", self.query_table.numpy().astype(np.float32))
        return {}

    @classmethod
    def load_own(cls, folder: Path, entry: dict, items: torch.Tensor, unranked: torch.Tensor | None) -> ServedPart:
        query_table = torch.from_numpy(numpy_load(folder / "query_table.npy"))
        return cls(items, query_table=query_table, unranked=unranked)
