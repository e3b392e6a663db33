"""EASE as the bundle serves it: a user's scores are x_u B (recsys/rankers/ease/ranker.py), an inner product of the
binary history x_u [I] (the query) and B's columns (the items). Files::

    items.npy    float32 [I, I]: row i is B[:, i], item i's column of B at the chosen λ

The item vectors have one dimension per item, so the part is I² floats (and a fusion's covariance of them I² more,
in float64): servable up to eval.settings.ease.max_served_items (docs/quality.md, "EASE in the served fusion").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recsys.rankers.parts import Catalogue, Query, ServedPart, register_part


def history_rows(query: Query, num_items: int) -> torch.Tensor:
    """float32 [B, I]: each query's distinct known items as a binary row (an item the catalogue lacks adds nothing)."""
    lengths = np.asarray(query.lengths, dtype=np.int64)
    items = np.asarray(query.items, dtype=np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    known = items >= 0
    out = torch.zeros(len(lengths), num_items)
    out[torch.from_numpy(rows[known]), torch.from_numpy(items[known])] = 1.0  # a repeated item stays 1
    return out


@register_part
class EasePart(ServedPart):
    ranker = "ease"
    reads_users = False  # a query is its items

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        """float32 [B, I]: x_u, the query's items as a binary row."""
        return history_rows(query, catalogue.num_items)

    @classmethod
    def load_own(cls, folder: Path, entry: dict, items: torch.Tensor, unranked: torch.Tensor | None) -> ServedPart:
        return cls(items, unranked)
