"""The graph filter as a ranker (``graph_filter``, settings ``eval.settings.graph_filter``); registered here, found
by recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.base import Ranker
from recsys.rankers.graph_filter import settings
from recsys.rankers.graph_filter.ranker import GraphFilterRanker
from recsys.rankers.registry import RankerContext, register_ranker


def build(c: RankerContext, s: settings.GraphFilterSettings) -> Ranker:
    return GraphFilterRanker(
        alphas=s.alphas, sharpens=s.sharpen, rank=s.rank, low_rank=s.low_rank, iterations=s.iterations,
        oversample=s.oversample, seed=c.seed, reduce=c.reduce,
    )  # fmt: skip


register_ranker(
    "graph_filter",
    build,
    settings=settings.GraphFilterSettings,
    check=settings.check_settings,
    resources=settings.check_resources,
    estimate=settings.estimate,
    label="graph filter",
)
