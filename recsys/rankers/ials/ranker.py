"""iALS as a ranker of the evaluation stage: one ALS fit per (λ, α) of its grid on the interactions a split follows,
each user's factors re-solved from their history; scores <x_u, y_i> (recsys/rankers/ials/solve.py)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker
from recsys.rankers.ials.settings import IalsSettings
from recsys.rankers.ials.solve import fit_ials, ials_user_factors


class IalsFit(DotProductFit):
    """The ALS models of one split's graph, fit per point when first asked for (the last one kept)."""

    def __init__(self, split: EvalSplit, settings: IalsSettings, seed: int) -> None:
        self.graph, self.fit_on, self.settings, self.seed = split.graph, split.fit_on, settings, seed
        self._model: tuple[tuple, object] | None = None

    def _model_at(self, point: Point):
        key = (float(point["regularization"]), float(point["alpha"]))
        if self._model is None or self._model[0] != key:
            model = fit_ials(
                self.graph, regularization=key[0], alpha=key[1], factors=self.settings.factors,
                iterations=self.settings.iterations, seed=self.seed,
            )  # fmt: skip
            self._model = (key, model)
        return self._model[1]

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        model = self._model_at(point)
        users = torch.from_numpy(ials_user_factors(model, split.history))
        return users, torch.from_numpy(np.asarray(model.item_factors, dtype=np.float32))

    def info(self) -> dict:
        return {"fit_on": self.fit_on, "factors": self.settings.factors, "iterations": self.settings.iterations}


class IalsRanker(Ranker):
    name = "ials"

    def __init__(self, settings: IalsSettings, seed: int = 0) -> None:
        self.settings_, self.seed = settings, seed

    def grid(self) -> list[Point]:
        s = self.settings_
        return [{"regularization": r, "alpha": a} for r in s.regularizations for a in s.alphas]

    def settings(self) -> dict:
        s = self.settings_
        return {
            "factors": s.factors,
            "iterations": s.iterations,
            "score": "<x_u, y_i>, x_u re-solved from u's history (Hu et al. 2008)",
        }

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        return IalsFit(split, self.settings_, self.seed)
