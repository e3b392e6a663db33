"""The ranker protocol: what the evaluation stage ranks a split with, the same for the two-tower and every baseline.

A :class:`Ranker` is fit on the interactions an evaluated split follows (:class:`EvalSplit`: ``graph``,
every user's items of the preceding splits) and returns a :class:`Fit`, which ranks that split's users:

    fit = ranker.fit(split, fits)                 # fits: the rankers fit on this split before it (a fusion's parts)
    ids = fit.topk(split, k, points)              # {point key: int64 [U, k]}, seen items masked

A ranker with settings to tune lists them as ``grid()`` points; the stage (``recsys.evaluation.stage``)
ranks valid at every point, keeps the best, and ranks test at that point only: a choice is passed in,
never remembered, so nothing depends on the order of calls. A :class:`DotProductFit` scores by the inner
product of query and item vectors, which is what the serving bundle and an ANN index can serve.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from recsys.rankers.points import Point, point_key
from recsys.rankers.served import Served
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk, topk_from_scores
from recsys.utils import progress


@dataclass(frozen=True)
class EvalSplit:
    """One evaluated split as the rankers see it; rows of ``history`` and ``relevant`` follow ``users``."""

    name: str  # "valid" | "test"
    users: np.ndarray  # int64 [U], ascending: the evaluated users
    history: UserItemCSR  # [U rows]: each user's items of the preceding splits: never ranked, and the input of history rankers
    graph: UserItemCSR  # [all users' rows]: every user's items of the preceding splits: what rankers are fit on
    relevant: UserItemCSR  # [U rows]: the held-out items
    preceding: tuple[str, ...]  # the splits ``graph`` holds, e.g. ("train", "valid")

    @property
    def fit_on(self) -> str:
        return " + ".join(self.preceding)

    def history_block(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Sparse CSR float32 [stop - start, I]: the binary history rows of users ``start:stop``."""
        h = self.history
        stop = h.num_users if stop is None else stop
        lo, hi = int(h.indptr[start]), int(h.indptr[stop])
        with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" note
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                torch.from_numpy(h.indptr[start : stop + 1] - lo),
                torch.from_numpy(h.indices[lo:hi]),
                torch.ones(hi - lo),
                size=(stop - start, h.num_items),
            )

    def pool_history(self, table: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """float32 [stop - start, D]: each user's sum of ``table``'s rows [I, D] over their history items
        (a sum-pooled bag, as the serving bundle's query encoder pools it)."""
        return self.history_block(start, stop) @ table


class Fit(ABC):
    """A ranker fit on one split's preceding interactions."""

    @abstractmethod
    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        """The top ``k`` item ids [U, k] of ``split``'s users at each point (by ``point_key``), ``split.history``
        masked; ties by lower item id, -1 where fewer than k items remain."""

    def info(self) -> dict:
        """What the fit saw or built, for results.json (sizes, seconds)."""
        return {}


class DotProductFit(Fit):
    """A fit that scores <query(u), item(i)>: the bundle serves it as a query encoder and an item matrix.

    ``unranked``: bool [I], items it has no vector of its own for (never-trained ids of managed tables, which share
    one row: recsys/ranking/untrained.py), left out of its ranking and of its bundle's; None: it ranks every item.
    """

    unranked: torch.Tensor | None = None
    # True: each point holds a large matrix of its own (EASE's B, I x I), so a grid that combines its points with
    # others' (a fusion's) is ranked one of its points at a time, never all of them per block
    one_point_per_pass: bool = False

    @abstractmethod
    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries float32 [U, D], items float32 [I, D]) of ``split``'s users at ``point``."""

    def served(self, point: Point) -> Served:
        """This fit at ``point`` as the serving bundle ships it: its parts (recsys/rankers/parts.py, served.py). A
        ranker with no servable part leaves it as it is: eval.serve refuses it."""
        raise NotImplementedError(f"{type(self).__name__}: no servable part")

    def score_blocks(
        self, split: EvalSplit, start: int, stop: int, points: Sequence[Point]
    ) -> Iterator[tuple[Point, torch.Tensor]]:
        """(point, fresh float32 scores [stop - start, I]) of users ``start:stop`` at each point. This one asks
        ``vectors`` per block: right for fits that hold their vectors, and overridden where points share work."""
        for point in points:
            queries, items = self.vectors(split, point)
            yield point, queries[start:stop] @ items.t()

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        """Each point ranked from its vectors, exactly as the serving bundle ranks them."""
        out = {}
        for point in points:
            queries, items = self.vectors(split, point)
            out[point_key(point)] = exact_topk(
                queries, items, k, exclude=split.history, chunk_size=chunk_size, unranked=self.unranked
            )[1]
        return out


ScoreBlocks = Callable[[int, int], Iterator[tuple[Point, torch.Tensor]]]


def blockwise_topk(
    split: EvalSplit,
    k: int,
    points: Sequence[Point],
    chunk_size: int,
    blocks: ScoreBlocks,
    unranked: torch.Tensor | None = None,
) -> dict:
    """The top ``k`` [U, k] at every point from ``blocks(start, stop)``, which yields (point, float32 scores
    [stop - start, I]) for users ``start:stop`` at each of ``points`` (fresh tensors: they are masked in place):
    a grid whose points share work (the graph filter's powers, a fusion's parts) is ranked in one pass.
    ``unranked``: bool [I], items never returned (``DotProductFit.unranked``)."""
    ids = {point_key(p): torch.empty(split.history.num_users, k, dtype=torch.int64) for p in points}
    for start in range(0, split.history.num_users, chunk_size):
        stop = min(start + chunk_size, split.history.num_users)
        for point, scores in blocks(start, stop):
            if unranked is not None:
                scores.masked_fill_(unranked.to(scores.device), float("-inf"))
            ids[point_key(point)][start:stop] = topk_from_scores(scores, k, exclude=split.history, row_offset=start)[1]
        progress.advance((stop - start) * len(points))  # the rows ranked at every point (recsys.utils.progress)
    return ids


class Ranker(ABC):
    """Something that ranks every item for a split's users: the two-tower, a baseline, a fusion of rankers."""

    name: str = ""
    servable: bool = False  # a DotProductFit the serving bundle can ship (recsys.export)

    def grid(self) -> list[Point]:
        """The settings tuned on valid (one point: nothing to tune)."""
        return [{}]

    def parts(self) -> tuple[str, ...]:
        """Rankers this one is built from, fit before it on the same split (a fusion's)."""
        return ()

    def settings(self) -> dict:
        """Its fixed settings, for results.json."""
        return {}

    @abstractmethod
    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        """Fit on ``split.graph`` (the interactions ``split`` follows); ``fits`` holds ``parts()``' fits."""
