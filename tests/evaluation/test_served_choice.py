"""The served ranker chosen on valid (eval.serve=""): the servable candidate with the best valid figure, the later
listed on a tie (a fusion whose beta = 0 ties the two-tower), the last without valid figures; a ranker that cannot be
served (popularity, EASE above its cap) is never chosen."""

import pytest

from recsys.evaluation.stage import choose_served
from recsys.rankers.base import Ranker


class _Named(Ranker):
    def __init__(self, name: str, servable: bool) -> None:
        self.name, self.servable = name, servable

    def fit(self, split, fits):  # never fit here
        raise NotImplementedError


RANKERS = [
    _Named("two_tower", True),
    _Named("popularity", False),
    _Named("two_tower+graph_filter", True),
    _Named("two_tower+ease", True),
]
CANDIDATES = ["two_tower", "popularity", "two_tower+graph_filter", "two_tower+ease"]


def _valid(**recalls: float) -> dict:
    return {name.replace("__", "+"): {"recall@20": value} for name, value in recalls.items()}


def test_the_best_servable_on_valid_is_served():
    valid = _valid(two_tower=0.30, popularity=0.9, two_tower__graph_filter=0.33, two_tower__ease=0.32)
    assert choose_served(RANKERS, CANDIDATES, valid, "recall@20") == "two_tower+graph_filter"


def test_a_tie_serves_the_later_listed_and_no_valid_serves_the_last():
    valid = _valid(two_tower=0.30, popularity=0.1, two_tower__graph_filter=0.30, two_tower__ease=0.29)
    assert choose_served(RANKERS, CANDIDATES, valid, "recall@20") == "two_tower+graph_filter"
    assert choose_served(RANKERS, CANDIDATES, {}, "recall@20") == "two_tower+ease"


def test_no_servable_candidate_is_an_error_naming_them():
    with pytest.raises(ValueError, match=r"none of \['popularity', 'ials'\] is a servable ranker"):
        choose_served([*RANKERS, _Named("ials", False)], ["popularity", "ials"], {}, "recall@20")
