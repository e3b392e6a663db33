"""EASE as a ranker of the evaluation stage: fit on the interactions a split follows (X'X once per split), each λ of
its grid one factorisation, scored on the split's users' histories (recsys/evaluation/ease.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch

from recsys.evaluation.ease import ease_from_gram, ease_topk, gram_dtype, gram_matrix
from recsys.evaluation.ease_plan import available_memory_bytes, plan_ease
from recsys.rankers.base import EvalSplit, Fit, Point, Ranker, point_key
from recsys.rankers.ease.settings import EaseSettings

log = logging.getLogger(__name__)


class EaseFit(Fit):
    """G = X'X of one split's graph; B of each λ asked for computed from it (G is kept, never overwritten)."""

    def __init__(self, gram: torch.Tensor, dtype: torch.dtype, fit_on: str, seconds: float) -> None:
        self.gram, self.dtype, self.fit_on, self.seconds = gram, dtype, fit_on, seconds

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        out = {}
        for point in points:
            b = ease_from_gram(self.gram, float(point["lambda"]), dtype=self.dtype)
            out[point_key(point)] = ease_topk(b, split.history, k, exclude=split.history, chunk_size=chunk_size)[1]
            del b  # one B at a time beside G
        return out

    def info(self) -> dict:
        return {
            "fit_on": self.fit_on,
            "dtype": str(self.dtype).removeprefix("torch."),
            "gram_seconds": round(self.seconds, 1),
        }


class EaseRanker(Ranker):
    name = "ease"

    def __init__(self, settings: EaseSettings, available_bytes: int | None = None) -> None:
        """``available_bytes``: the memory its dtype is planned with; None: measured at each fit."""
        self.lambdas = [float(v) for v in settings.lambdas]
        self.available_bytes = available_bytes

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
        return EaseFit(gram, plan.dtype, split.fit_on, time.perf_counter() - start)
