"""A servable plug-in ranker, all in this package (and tests/plugins/conf/eval/rankers/toy.yaml): what a user adds to
serve a ranker of their own through the bundle.

``toy`` sketches the item co-occurrence with a random projection R [I, d]: score(u, i) = sum over u's items j of
<R_j, (X'X R)_i>, i.e. <query(u), item(i)> with query(u) = sum of R's rows over u's items and item(i) = (X'X R)_i.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys.config.need import Need
from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker
from recsys.rankers.parts import Catalogue, Query, ServedPart, register_part
from recsys.rankers.registry import RankerContext, register_ranker
from recsys.rankers.served import Served
from recsys.utils.safe_load import numpy_load

NAME = "toy"


@dataclass
class ToySettings:
    dim: int = 32  # columns of the random projection
    seed: int = 0  # seeds the projection


def check(s: ToySettings, need: Need, key: str) -> None:
    need(s.dim >= 1, f"{key}.dim", s.dim, "must be >= 1")


@register_part
class ToyPart(ServedPart):
    ranker = NAME

    def __init__(self, items: torch.Tensor, *, projection: torch.Tensor, unranked=None) -> None:
        super().__init__(items, unranked)
        self.projection = projection

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        users = np.repeat(np.arange(len(query.lengths)), query.lengths)
        out = torch.zeros(len(query.lengths), self.projection.shape[1])
        out.index_add_(0, torch.from_numpy(users), self.projection[torch.from_numpy(query.items)])
        return out

    def save_own(self, folder: Path) -> dict:
        np.save(folder / "projection.npy", self.projection.numpy())
        return {}

    @classmethod
    def load_own(cls, folder: Path, entry: dict, items: torch.Tensor, unranked) -> ServedPart:
        return cls(items, projection=torch.from_numpy(numpy_load(folder / "projection.npy")), unranked=unranked)


class ToyFit(DotProductFit):
    def __init__(self, projection: torch.Tensor, items: torch.Tensor) -> None:
        self.projection, self.items = projection, items

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        return split.pool_history(self.projection), self.items

    def served(self, point: Point) -> Served:
        return Served([ToyPart(self.items, projection=self.projection)], [1.0])


class ToyRanker(Ranker):
    name = NAME
    servable = True  # its fit is a DotProductFit with a registered part: a candidate for the served ranker

    def __init__(self, settings: ToySettings) -> None:
        self.settings_ = settings

    def settings(self) -> dict:
        return {"dim": self.settings_.dim, "seed": self.settings_.seed}

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        g = torch.Generator().manual_seed(self.settings_.seed)
        projection = torch.randn(split.graph.num_items, self.settings_.dim, generator=g)
        graph = split.graph
        users = np.repeat(np.arange(graph.num_users), np.diff(graph.indptr))
        x = torch.sparse_coo_tensor(
            torch.from_numpy(np.stack([users, graph.indices])),
            torch.ones(graph.nnz),
            (graph.num_users, graph.num_items),
        )
        items = (x.t() @ (x @ projection)).contiguous()  # X'X R, without the [I, I] matrix
        return ToyFit(projection, items)


def build(context: RankerContext, settings: ToySettings) -> Ranker:
    return ToyRanker(settings)


register_ranker(NAME, build, settings=ToySettings, check=check)
