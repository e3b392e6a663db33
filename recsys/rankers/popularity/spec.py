"""Popularity as a ranker (``popularity``): the training split's counts, one global order; registered here, found by
recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.cost import RankerCost
from recsys.rankers.popularity.ranker import PopularityRanker
from recsys.rankers.registry import POPULARITY, register_ranker
from recsys.rankers.resources import Resources


def estimate(settings: None, r: Resources) -> RankerCost:
    return RankerCost(pairwise=False, user_s=2e-5)  # the head of one global order a user (popularity_topk)


register_ranker(POPULARITY, lambda c, s: PopularityRanker(c.train_counts), estimate=estimate)
