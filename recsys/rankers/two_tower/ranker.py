"""The trained two-tower as a ranker: its query and item embeddings, computed by the run (collectively, on every
rank) before the evaluation stage, ranked by inner product."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker
from recsys.rankers.served import Served
from recsys.rankers.two_tower.part import TwoTowerPart


class TwoTowerFit(DotProductFit):
    def __init__(
        self, queries: torch.Tensor, items: torch.Tensor, trained_on: str, unranked: torch.Tensor | None = None
    ) -> None:
        self.queries, self.items, self.trained_on = queries.float(), items.float(), trained_on
        self.unranked = unranked  # never-trained items of managed tables: one shared row, left out

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        if self.queries.shape[0] != split.history.num_users:
            raise ValueError(
                f"two_tower: {self.queries.shape[0]} query embeddings for {split.history.num_users} users of {split.name}"
            )
        return self.queries, self.items

    def info(self) -> dict:
        return {"fit_on": f"{self.trained_on} (the trained weights; queries read the preceding splits)"}

    def served(self, point: Point) -> Served:
        """The item embeddings; the bundle adds the query encoder (recsys/rankers/two_tower/part.py)."""
        return Served([TwoTowerPart(self.items, self.unranked)], [1.0])


class TwoTowerRanker(Ranker):
    name = "two_tower"
    servable = True

    def __init__(
        self,
        embeddings: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        trained_on: str,
        unranked: torch.Tensor | None = None,
    ) -> None:
        """``embeddings``: split name -> (its users' query embeddings [U, D], the item embeddings [I, D]);
        ``unranked``: bool [I], the items the weights have no row of their own for (left out of the ranking)."""
        self.embeddings, self.trained_on, self.unranked = embeddings, trained_on, unranked

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        if split.name not in self.embeddings:
            raise KeyError(f"two_tower: no embeddings of the {split.name} split's users")
        return TwoTowerFit(*self.embeddings[split.name], self.trained_on, self.unranked)
