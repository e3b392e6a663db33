"""The plain two-tower (model.py) as a report ranker: trained on the interactions a split follows, once per
(dim, τ, lr) of its grid, its tables taken after each epoch count of the grid; valid ranks every point, test the
one chosen, trained again on train + valid as every ranker is."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker
from recsys.rankers.plain_two_tower.model import Tables, train_plain_two_tower
from recsys.rankers.plain_two_tower.settings import PlainTwoTowerSettings


class PlainTwoTowerFit(DotProductFit):
    """One split's trainings, run per (dim, τ, lr) when a point first asks (the last one's epochs kept)."""

    def __init__(self, split: EvalSplit, settings: PlainTwoTowerSettings, seed: int) -> None:
        self.graph, self.fit_on, self.settings, self.seed = split.graph, split.fit_on, settings, seed
        self._trained: tuple[tuple, dict[int, Tables]] | None = None

    def _tables(self, point: Point) -> Tables:
        key = (int(point["dim"]), float(point["temperature"]), float(point["lr"]))
        if self._trained is None or self._trained[0] != key:
            s = self.settings
            tables = train_plain_two_tower(
                self.graph, dim=key[0], temperature=key[1], lr=key[2], epochs=s.epochs, batch_size=s.batch_size,
                logq_correction=s.logq_correction, seed=self.seed,
            )  # fmt: skip
            self._trained = (key, tables)
        return self._trained[1][int(point["epochs"])]

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        users, items = self._tables(point)
        return users[torch.from_numpy(split.users)], items

    def info(self) -> dict:
        return {"fit_on": self.fit_on, "batch_size": self.settings.batch_size}


class PlainTwoTowerRanker(Ranker):
    name = "plain_two_tower"

    def __init__(self, settings: PlainTwoTowerSettings, seed: int = 0) -> None:
        self.settings_, self.seed = settings, seed

    def grid(self) -> list[Point]:
        s = self.settings_  # epochs innermost: the points of one training are ranked together
        return [
            {"dim": d, "temperature": t, "lr": lr, "epochs": e}
            for d in s.dims for t in s.temperatures for lr in s.learning_rates for e in sorted(set(s.epochs))
        ]  # fmt: skip

    def settings(self) -> dict:
        return {
            "batch_size": self.settings_.batch_size,
            "logq_correction": self.settings_.logq_correction,
            "score": "<u, i> of L2-normalised user-id and item-id embeddings, in-batch softmax, Adam",
        }

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        return PlainTwoTowerFit(split, self.settings_, self.seed)
