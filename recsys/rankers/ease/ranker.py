"""EASE as a ranker of the evaluation stage: fit on the interactions a split follows (X'X once per split), each λ of
its grid one factorisation, scored on the split's users' histories (recsys/rankers/ease/solve.py).

Its scores x_u B are an inner product of the binary history x_u and B's columns, so a catalogue of up to
``max_served_items`` is served like any dot-product ranker (recsys/rankers/ease/part.py), alone or as a fusion's part;
its single-point ranking is then the bundle's math (a dense history block times the item vectors), its grid on valid
the sparse product of ``ease_topk``, one B at a time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence

import torch

from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker, point_key
from recsys.rankers.ease.part import EasePart
from recsys.rankers.ease.plan import available_memory_bytes, plan_ease
from recsys.rankers.ease.settings import EaseSettings
from recsys.rankers.ease.solve import ease_from_gram, ease_topk, gram_dtype, gram_matrix
from recsys.rankers.served import Served
from recsys.ranking.retrieval import chunked_topk

log = logging.getLogger(__name__)


class EaseFit(DotProductFit):
    """G = X'X of one split's graph; B of each λ asked for computed from it (G is kept, never overwritten), the last
    one kept (a fusion's grid asks for one λ at a time: ``one_point_per_pass``)."""

    one_point_per_pass = True

    def __init__(
        self, gram: torch.Tensor, dtype: torch.dtype, fit_on: str, seconds: float, max_served_items: int
    ) -> None:
        self.gram, self.dtype, self.fit_on, self.seconds = gram, dtype, fit_on, seconds
        self.max_served_items = max_served_items
        self._last: tuple[float, torch.Tensor] | None = None  # (λ, item vectors B' float32 [I, I])

    @property
    def num_items(self) -> int:
        return int(self.gram.shape[0])

    def item_vectors(self, lam: float) -> torch.Tensor:
        """float32 [I, I], row i = B[:, i] at ``lam`` (the last λ's kept: one [I, I] matrix beside G)."""
        if self._last is None or self._last[0] != lam:
            self._last = None  # the previous λ's matrix freed before the next is made
            b = ease_from_gram(self.gram, lam, dtype=self.dtype)
            self._last = (lam, b.t().contiguous())
            del b
        return self._last[1]

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_servable()
        return split.history_block().to_dense(), self.item_vectors(float(point["lambda"]))

    def score_blocks(
        self, split: EvalSplit, start: int, stop: int, points: Sequence[Point]
    ) -> Iterator[tuple[Point, torch.Tensor]]:
        for point in points:
            yield point, split.history_block(start, stop) @ self.item_vectors(float(point["lambda"])).t()

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        if len(points) == 1 and self.num_items <= self.max_served_items:
            return {point_key(points[0]): self._served_topk(split, k, points[0], chunk_size)}
        out = {}
        for point in points:
            self._last = None  # B is made here for ease_topk: no second [I, I] matrix kept beside it
            b = ease_from_gram(self.gram, float(point["lambda"]), dtype=self.dtype)
            out[point_key(point)] = ease_topk(b, split.history, k, exclude=split.history, chunk_size=chunk_size)[1]
            del b  # one B at a time beside G
        return out

    def _served_topk(self, split: EvalSplit, k: int, point: Point, chunk_size: int) -> torch.Tensor:
        """Top ``k`` [U, k] as the bundle ranks them (``exact_topk``'s product: dense queries times the items')."""
        items_t = self.item_vectors(float(point["lambda"])).t()

        def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
            return torch.mm(split.history_block(start, stop).to_dense(), items_t, out=out)

        h = split.history
        return chunked_topk(score_chunk, h.num_users, h.num_items, k, exclude=h, chunk_size=chunk_size)[1]

    def served(self, point: Point) -> Served:
        """B's columns at ``point``'s λ (recsys/rankers/ease/part.py)."""
        self._check_servable()
        return Served([EasePart(self.item_vectors(float(point["lambda"])))], [1.0])

    def _check_servable(self) -> None:
        if self.num_items > self.max_served_items:
            raise ValueError(
                f"eval.settings.ease.max_served_items={self.max_served_items}: EASE over {self.num_items:,} items is "
                "not served (its item vectors are I x I)"
            )

    def info(self) -> dict:
        return {
            "fit_on": self.fit_on,
            "dtype": str(self.dtype).removeprefix("torch."),
            "gram_seconds": round(self.seconds, 1),
        }


class EaseRanker(Ranker):
    name = "ease"

    def __init__(self, settings: EaseSettings, num_items: int, available_bytes: int | None = None) -> None:
        """``num_items``: the catalogue's size (servable up to ``settings.max_served_items``); ``available_bytes``:
        the memory its dtype is planned with; None: measured at each fit."""
        self.lambdas = [float(v) for v in settings.lambdas]
        self.available_bytes = available_bytes
        self.max_served_items = settings.max_served_items
        self.servable = num_items <= settings.max_served_items

    def grid(self) -> list[Point]:
        return [{"lambda": v} for v in self.lambdas]

    def settings(self) -> dict:
        return {
            "lambdas": self.lambdas,
            "score": "x_u B, B = I - P diagMat(1/diag P), P = (X'X + lambda I)^-1 (Steck 2019)",
        }

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        graph = split.graph
        available = self.available_bytes if self.available_bytes is not None else available_memory_bytes()
        plan = plan_ease(graph.num_items, graph.num_users, available)
        if plan.dtype is None:  # the memory went since the start-up check (recsys.rankers.registry.check_resources)
            raise MemoryError(f"ease: {plan.skipped}")
        log.info("EASE: Gram matrix of %d items of %s, the inverse in %s", graph.num_items, split.fit_on, plan.dtype)
        start = time.perf_counter()
        gram = gram_matrix(graph, dtype=gram_dtype(graph.num_users, plan.dtype))
        return EaseFit(gram, plan.dtype, split.fit_on, time.perf_counter() - start, self.max_served_items)
