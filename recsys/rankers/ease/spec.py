"""EASE as a ranker (``ease``, settings ``eval.settings.ease``); registered here, found by recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.ease import settings
from recsys.rankers.ease.ranker import EaseRanker
from recsys.rankers.registry import register_ranker

register_ranker(
    "ease",
    lambda c, s: EaseRanker(s, len(c.train_counts), c.available_bytes),
    settings=settings.EaseSettings,
    check=settings.check_settings,
    resources=settings.check_resources,
    estimate=settings.estimate,
    label="EASE",
)
