"""A fusion of two dot-product rankers, itself a dot product: what the bundle serves when valid prefers it.

The fused score of user u and item i adds the parts' scores, each divided by its spread over the user's
scores of all items, so that ``beta`` weighs like against like (beta = 0: the first part alone):

    s(u, i) = a(u, i) / std_i a(u, .)  +  beta * b(u, i) / std_i b(u, .)

A part's score is <q(u), c(i)>, so its spread is sqrt(q' C q), C the covariance of its item vectors
[D, D] (centred, over all I items, ddof 1), and the fused score is one inner product again:

    query(u) = [ q_a / sqrt(q_a' C_a q_a) , beta * q_b / sqrt(q_b' C_b q_b) ]      item(i) = [ c_a(i) , c_b(i) ]

written once, ``fuse_queries``, which the fusion's fit (the evaluation stage) and the served ranker
(recsys/rankers/served.py: the bundle) both call, and which an ANN index searches. A grid of points is ranked from
score blocks, each row's spread taken from the block (the same quantity).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from recsys.config.need import Need
from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker, blockwise_topk
from recsys.rankers.parts import either
from recsys.rankers.served import Served
from recsys.rankers.spread import SPREAD_FLOOR, fuse_queries, item_covariance


@dataclass
class FusionSettings:
    """Every fusion ranker ``first+second`` (``eval.settings.fusion``: conf/eval/rankers/fusion.yaml)."""

    # weights of the second part, chosen on valid (0: the first alone)
    betas: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.2])


def check_settings(s: FusionSettings, need: Need, key: str) -> None:
    ok = len(s.betas) > 0 and all(b >= 0 for b in s.betas)
    need(ok, f"{key}.betas", list(s.betas), "must be a non-empty list of values >= 0")


def spread_normalised_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` [C, I] divided in place by each row's standard deviation (ddof 1)."""
    centred_norm = torch.linalg.vector_norm(scores - scores.mean(dim=1, keepdim=True), dim=1, keepdim=True)
    return scores.div_((centred_norm / math.sqrt(max(scores.shape[1] - 1, 1))).clamp_min_(SPREAD_FLOOR))


class FusionFit(DotProductFit):
    def __init__(self, first: DotProductFit, second: DotProductFit, first_keys: Sequence[str]) -> None:
        self.first, self.second, self.first_keys = first, second, set(first_keys)
        # an item either part leaves out: its fused score would add that part's tie (beta = 0 is the first alone)
        self.unranked = either([first.unranked, second.unranked])

    def _split_point(self, point: Point) -> tuple[dict, dict, float]:
        first = {k: v for k, v in point.items() if k in self.first_keys}
        second = {k: v for k, v in point.items() if k not in self.first_keys and k != "beta"}
        return first, second, float(point["beta"])

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        first, second, beta = self._split_point(point)
        qa, ca = self.first.vectors(split, first)
        qb, cb = self.second.vectors(split, second)
        queries = fuse_queries([qa, qb], [item_covariance(ca), item_covariance(cb)], [1.0, beta])
        return queries, torch.cat([ca, cb], dim=1)

    def served(self, point: Point) -> Served:
        """Both parts at their settings of ``point``, fused with weights [1, beta] (what the bundle serves)."""
        first, second, beta = self._split_point(point)
        parts = [*self.first.served(first).parts, *self.second.served(second).parts]
        return Served(parts, [1.0, beta])

    def score_blocks(
        self, split: EvalSplit, start: int, stop: int, points: Sequence[Point]
    ) -> Iterator[tuple[Point, torch.Tensor]]:
        parsed = [self._split_point(p) for p in points]
        firsts = {_key(a): a for a, _, _ in parsed}
        seconds = {_key(b): b for _, b, _ in parsed}
        first_blocks = {  # usually one (the two-tower has nothing to tune)
            _key(p): spread_normalised_rows(s)
            for p, s in self.first.score_blocks(split, start, stop, list(firsts.values()))
        }
        for b_point, b_scores in self.second.score_blocks(split, start, stop, list(seconds.values())):
            b_scores = spread_normalised_rows(b_scores)
            for point, (a, b, beta) in zip(points, parsed):
                if _key(b) == _key(b_point):
                    yield point, torch.add(first_blocks[_key(a)], b_scores, alpha=beta)

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        if len(points) == 1:
            return super().topk(split, k, points, chunk_size)
        out = {}
        for group in self._passes(points):
            blocks = partial(self._group_blocks, split, group)
            out.update(blockwise_topk(split, k, group, chunk_size, blocks, self.unranked))
        return out

    def _group_blocks(
        self, split: EvalSplit, group: Sequence[Point], start: int, stop: int
    ) -> Iterator[tuple[Point, torch.Tensor]]:
        return self.score_blocks(split, start, stop, group)

    def _passes(self, points: Sequence[Point]) -> list[list[Point]]:
        """``points`` in the groups ranked in one pass each: all together, or one group per point of a part that
        ranks a point at a time (``one_point_per_pass``)."""
        groups: dict[tuple, list[Point]] = {}
        for point in points:
            a, b, _ = self._split_point(point)
            key = (
                _key(a) if self.first.one_point_per_pass else (),
                _key(b) if self.second.one_point_per_pass else (),
            )
            groups.setdefault(key, []).append(point)
        return list(groups.values())

    def info(self) -> dict:
        """The parts' (the second's sizes: the graph filter's interactions and rank), fit on the split's graph."""
        return {k: v for part in (self.first, self.second) for k, v in part.info().items() if k != "fit_on"}


def _key(point: Mapping[str, float]) -> tuple:
    return tuple(sorted(point.items()))


class FusionRanker(Ranker):
    """``first+second``: two dot-product rankers fused (module docstring); beta, and each part's own settings,
    are chosen together on valid."""

    servable = True

    def __init__(self, first: Ranker, second: Ranker, betas: Sequence[float]) -> None:
        if not (first.servable and second.servable):
            raise ValueError(f"{first.name}+{second.name}: a fusion needs two dot-product rankers")
        self.first, self.second, self.betas = first, second, [float(b) for b in betas]
        self.name = f"{first.name}+{second.name}"

    def parts(self) -> tuple[str, ...]:
        return (self.first.name, self.second.name)

    def grid(self) -> list[Point]:
        a_grid, b_grid = self.first.grid(), self.second.grid()
        # beta = 0 ranks as the first part alone whatever the second's settings: one point for it
        zero = [{**a_grid[0], **b_grid[0], "beta": 0.0}] if 0.0 in self.betas else []
        return zero + [{**a, **b, "beta": beta} for b in b_grid for a in a_grid for beta in self.betas if beta]

    def settings(self) -> dict:
        return {
            "betas": self.betas,
            "score": "a / std(a) + beta * b / std(b), each std over the user's scores of all items",
        }

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        first, second = fits[self.first.name], fits[self.second.name]
        assert isinstance(first, DotProductFit) and isinstance(second, DotProductFit)
        return FusionFit(first, second, first_keys=[k for p in self.first.grid() for k in p])
