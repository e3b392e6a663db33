"""iALS as a ranker (``ials``, settings ``eval.settings.ials``); registered here, found by recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.ials import settings
from recsys.rankers.ials.ranker import IalsRanker
from recsys.rankers.registry import register_ranker

register_ranker(
    "ials",
    lambda c, s: IalsRanker(s, c.seed),
    settings=settings.IalsSettings,
    check=settings.check_settings,
    resources=settings.check_resources,
    estimate=settings.estimate,
    label="iALS",
)
