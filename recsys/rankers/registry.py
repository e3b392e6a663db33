"""The rankers by name, built from the run's config and what it computed before the evaluation stage.

    rankers, parts = build_rankers(["two_tower", "popularity", "two_tower+graph_filter"], context)

A name ``a+b`` is the fusion of the rankers ``a`` and ``b`` (``fusion``); any other name is looked up in
``RANKERS``. A new ranker is one module plus one entry here (``register_ranker``, also from a test or a plugin).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from data_pipelines.errors import ConfigError
from recsys.config import EvalConfig
from recsys.rankers.base import Ranker
from recsys.rankers.fusion import FusionRanker
from recsys.rankers.graph_filter import GraphFilterRanker
from recsys.rankers.popularity import PopularityRanker
from recsys.rankers.spectral import Reduce
from recsys.rankers.two_tower import TwoTowerRanker


@dataclass
class RankerContext:
    """What a ranker may be built from: the eval config, and what the run computed before the stage."""

    eval: EvalConfig
    train_counts: np.ndarray  # int64 [I]: interactions per item in the training split
    trained_on: str = "train"  # the splits the two-tower's weights were trained on
    # split name -> (its users' query embeddings [U, D], item embeddings [I, D]) of the trained two-tower
    embeddings: Mapping[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    seed: int = 0
    reduce: Reduce | None = None  # sums over the ranks that hold the users' rows between them (data.shard_by_user)
    # bool [I]: items the two-tower's weights hold no row of their own for (recsys/evaluation/untrained.py), left out
    unranked_items: torch.Tensor | None = None


RankerFactory = Callable[[RankerContext], Ranker]

RANKERS: dict[str, RankerFactory] = {
    "two_tower": lambda c: TwoTowerRanker(c.embeddings, c.trained_on, c.unranked_items),
    "popularity": lambda c: PopularityRanker(c.train_counts),
    "graph_filter": lambda c: GraphFilterRanker(
        alphas=c.eval.graph_filter.alphas,
        sharpens=c.eval.graph_filter.sharpen,
        rank=c.eval.graph_filter.rank,
        low_rank=c.eval.graph_filter.low_rank,
        iterations=c.eval.graph_filter.iterations,
        oversample=c.eval.graph_filter.oversample,
        seed=c.seed,
        reduce=c.reduce,
    ),
}


def register_ranker(name: str, factory: RankerFactory) -> None:
    """Make ``name`` usable in eval.rankers (and as a part of fusions)."""
    if "+" in name:
        raise ValueError(f"ranker name {name!r}: '+' joins the parts of a fusion")
    RANKERS[name] = factory


def check_ranker_names(names: Sequence[str]) -> None:
    """Refuse an unknown ranker name, naming eval.rankers and the known ones."""
    for name in names:
        for part in name.split("+"):
            if part not in RANKERS:
                raise ConfigError(
                    f"eval.rankers: unknown ranker {part!r} in {name!r}; known: {', '.join(sorted(RANKERS))}, and "
                    "fusions a+b of them (a plug-in's rankers: name its module in eval.plugins)"
                )
        if name.count("+") > 1:
            raise ConfigError(f"eval.rankers: {name!r}: a fusion has two parts (a+b)")


def build_rankers(names: Sequence[str], context: RankerContext) -> tuple[list[Ranker], list[Ranker]]:
    """(the rankers ``names`` lists, in order; the parts its fusions need that it does not list)."""
    check_ranker_names(names)
    built: dict[str, Ranker] = {}

    def get(name: str) -> Ranker:
        if name not in built:
            if "+" in name:
                first, second = name.split("+")
                built[name] = FusionRanker(get(first), get(second), context.eval.fusion.betas)
            else:
                built[name] = RANKERS[name](context)
        return built[name]

    listed = [get(name) for name in names]
    return listed, [r for name, r in built.items() if name not in names]
