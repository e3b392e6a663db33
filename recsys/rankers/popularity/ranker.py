"""The popularity baseline: every user gets the items with the most training interactions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from recsys.rankers.base import EvalSplit, Fit, Point, Ranker, point_key
from recsys.ranking.retrieval import popularity_topk


class PopularityFit(Fit):
    def __init__(self, counts: np.ndarray, counted_on: str) -> None:
        self.counts, self.counted_on = counts, counted_on

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        counts = torch.from_numpy(self.counts).float()
        ids = popularity_topk(counts, split.history.num_users, k, exclude=split.history, chunk_size=chunk_size)[1]
        return {point_key(p): ids for p in points}

    def info(self) -> dict:
        return {"fit_on": self.counted_on}


class PopularityRanker(Ranker):
    name = "popularity"

    def __init__(self, train_counts: np.ndarray, counted_on: str = "train") -> None:
        """``train_counts`` [I]: interactions per item in the training split (the same counts for every split)."""
        self.train_counts, self.counted_on = np.asarray(train_counts), counted_on

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        return PopularityFit(self.train_counts, self.counted_on)
