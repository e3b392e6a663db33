"""Learning-rate schedules over training progress (``optim.schedule``), for the tables and the towers alike.

The factor multiplies every optimizer group's configured learning rate before each step. Progress is
counted in epochs (``epoch + batch / batches per epoch``), so a refit on train + valid, whose epochs
have more steps, replays the selection stage's curve epoch for epoch (``optim.schedule_epochs``).
fbgemm's fused optimizers read their group's ``lr`` at each ``step()`` (torchrec's
EmbeddingFusedOptimizer), so the tables follow it one step later, which no curve can tell apart.

    constant   1
    linear     1 - progress / horizon, down to 0 at the horizon (the end of ``trainer.epochs``)
"""

from __future__ import annotations

import torch

SCHEDULES = ("constant", "linear")


def lr_factor(schedule: str, progress: float, horizon: float) -> float:
    """The multiplier of the configured learning rates after ``progress`` of ``horizon`` epochs."""
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, 1.0 - progress / horizon)
    raise ValueError(f"optim.schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")


class LrSchedule:
    """Sets ``optimizer``'s groups to their learning rates at construction times ``lr_factor``.

    Built before a checkpoint is loaded: a checkpoint's param groups carry the rates of the step it
    was saved at, and the factor is recomputed from the progress on every step, so a resumed run
    follows the same curve as an uninterrupted one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: str, horizon_epochs: float) -> None:
        lr_factor(schedule, 0.0, 1.0)  # an unknown name fails here, before any step
        if horizon_epochs <= 0:
            raise ValueError(f"optim.schedule_epochs: the horizon must be > 0 epochs, got {horizon_epochs}")
        self.schedule, self.horizon = schedule, float(horizon_epochs)
        self.groups = optimizer.param_groups
        self.base_lrs = [float(g["lr"]) for g in self.groups]
        self.factor = 1.0  # the last one applied

    def apply(self, progress: float) -> float:
        """Set the rates for ``progress`` epochs into training; returns the factor."""
        factor = self.factor = lr_factor(self.schedule, progress, self.horizon)
        if self.schedule != "constant":  # constant: leave the groups alone (no float round trip)
            for group, base in zip(self.groups, self.base_lrs):
                group["lr"] = base * factor
        return factor
