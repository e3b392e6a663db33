"""A plain PyTorch user-id two-tower as a ranker (``plain_two_tower``, settings ``eval.settings.plain_two_tower``): the
baseline recsys's own is measured against; registered here, found by recsys/rankers/builtin.py."""

from __future__ import annotations

from recsys.rankers.plain_two_tower import settings
from recsys.rankers.plain_two_tower.ranker import PlainTwoTowerRanker
from recsys.rankers.registry import register_ranker

register_ranker(
    "plain_two_tower",
    lambda c, s: PlainTwoTowerRanker(s, c.seed),
    settings=settings.PlainTwoTowerSettings,
    check=settings.check_settings,
    label="plain two-tower",
)
