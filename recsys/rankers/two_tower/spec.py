"""The trained two-tower as a ranker (``two_tower``): its users' and items' embeddings from the run, scored by one
dot product; registered here, found by recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.cost import RankerCost, dot_product_cost
from recsys.rankers.registry import TRAINED, register_ranker
from recsys.rankers.resources import Resources
from recsys.rankers.two_tower.ranker import TwoTowerRanker


def estimate(settings: None, r: Resources) -> RankerCost:
    return dot_product_cost(r.query_dim, r.throughput, chunk_size=r.chunk_size, items=r.num_items)


register_ranker(
    TRAINED,
    lambda c, s: TwoTowerRanker(c.embeddings, c.trained_on, c.unranked_items),
    estimate=estimate,
    label="two-tower",
)
