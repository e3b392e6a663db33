"""The negatives a training batch shares (``model.negatives``): which items are drawn, and with what probability.

Drawn per global batch from (seed, epoch, batch), so every rank draws the same ones; the loss's logQ uses
``sampling_probs`` (recsys/model/task.py), the distribution they are drawn from.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

WHOLE_CATALOGUE = -1  # model.negatives.num: every item, every step (a full softmax)


def sampling_probs(counts: np.ndarray, exponent: float) -> np.ndarray:
    """s(i) proportional to counts[i] ** exponent (float64, sums to 1); exponent 0: uniform over every item."""
    if exponent == 0:
        return np.full(len(counts), 1.0 / len(counts))
    weights = np.asarray(counts, dtype=np.float64) ** exponent  # an item never trained on: weight 0
    total = weights.sum()
    if total <= 0:
        raise ValueError("model.negatives.exponent > 0 needs training counts: no item was trained on")
    return weights / total


class NegativeSampler:
    """``num`` items per draw from ``sampling_probs(counts(), exponent)``, with replacement, of ``num_items``."""

    def __init__(self, num: int, exponent: float, num_items: int, counts: Callable[[], np.ndarray]) -> None:
        """``counts``: the items' training counts, asked for only when the draws are not uniform (no O(items)
        array otherwise: catalogues of 10^9 ids)."""
        self.num, self.num_items = num, num_items
        # uniform draws keep rng.integers (the draws of every earlier run); others invert the CDF
        self.cdf = None if exponent == 0 or num <= 0 else np.cumsum(sampling_probs(counts(), exponent))

    @property
    def whole_catalogue(self) -> bool:
        return self.num == WHOLE_CATALOGUE

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """[num] int64 item ids."""
        if self.cdf is None:
            return rng.integers(0, self.num_items, max(self.num, 0), dtype=np.int64)
        # side="right": u in [cdf[i-1], cdf[i]) draws item i, so an item of probability 0 is never drawn
        drawn = np.searchsorted(self.cdf, rng.random(self.num) * self.cdf[-1], side="right")
        return np.minimum(drawn, self.num_items - 1).astype(np.int64)  # u == cdf[-1] only by rounding
