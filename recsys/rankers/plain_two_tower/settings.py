"""The plain two-tower's settings (``eval.settings.plain_two_tower``: conf/eval/rankers/plain_two_tower.yaml): the grid
a careful user would tune a textbook two-tower over on valid, and its rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.need import Need


@dataclass
class PlainTwoTowerSettings:
    """A user-id and an item-id embedding, L2-normalised, trained with logQ-corrected in-batch softmax by Adam
    (recsys/rankers/plain_two_tower/model.py); every combination of the lists below ranked on valid."""

    dims: list[int] = field(default_factory=lambda: [64, 128])  # the embeddings' width
    temperatures: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.35])  # the softmax's τ
    learning_rates: list[float] = field(default_factory=lambda: [0.003, 0.01])  # Adam's
    # the epochs ranked: one training per (dim, τ, lr) to the largest, its tables taken after each of these
    epochs: list[int] = field(default_factory=lambda: [5, 10, 20, 40])
    batch_size: int = 1024  # (user, item) rows a step; the rest of the batch is each row's negatives
    # true: each logit less log(the item's share of the training rows), the in-batch sampler's bias removed (logQ)
    logq_correction: bool = True


def check_settings(s: PlainTwoTowerSettings, need: Need, key: str) -> None:
    for name in ("dims", "epochs"):
        values = list(getattr(s, name))
        need(len(values) > 0 and all(int(v) >= 1 for v in values), f"{key}.{name}", values, "must be integers >= 1")
    for name in ("temperatures", "learning_rates"):
        values = list(getattr(s, name))
        need(len(values) > 0 and all(v > 0 for v in values), f"{key}.{name}", values, "must be values > 0")
    need(s.batch_size >= 2, f"{key}.batch_size", s.batch_size, "must be >= 2 (a row's negatives are the others)")
