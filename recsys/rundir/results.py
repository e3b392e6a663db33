"""results.json's training part: the run's steps, speed and best epoch, the dataset, the weights tested.
(Apart from outputs.py, which recsys.utils.refusals reaches through the sweep summary: TrainerState here would
close an import cycle.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from recsys.data.dataset import RetrievalData
from recsys.rundir.checkpoint import TrainerState


def split_counts(data: RetrievalData) -> dict[str, int]:
    """Each split's rows in the whole dataset (also where this rank holds some users only)."""
    return {s: int(data.meta.get("counts", {}).get(s, len(v))) for s, v in data.splits.items()}


def training_results(
    state: TrainerState,
    data: RetrievalData,
    world_size: int,
    best: Path | None,
    managed: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """What results.json holds of the training (the evaluation stage adds valid, test and the rankers):
    ``best`` is the checkpoint tested (None: the last step's weights), ``managed`` the managed tables' counts."""
    counts = split_counts(data)
    return {
        "train": {
            "samples_per_s": state.samples / max(state.train_seconds, 1e-9),
            "samples": state.samples,
            "seconds": state.train_seconds,
            "steps": state.step,
            "best_epoch": state.best_epoch,
            # the early-stopping metric (eval.valid_metric) of the best epoch; None: nothing was validated
            "best_valid": state.best_score if math.isfinite(state.best_score) else None,
            "world_size": world_size,
        },
        "dataset": {
            **({"given_split": data.meta["given_split"]} if "given_split" in data.meta else {}),  # dropped rows
            "dir": str(data.dir),
            "name": data.meta.get("name"),
            "protocol": data.meta.get("protocol"),
            "counts": {
                **counts,
                "users": data.num_users,
                "items": data.num_items,
                "categories": data.num_categories,
            },
        },
        "checkpoint": str(best) if best is not None else "",  # the weights tested ("": the last step's)
        **({"managed": managed} if managed else {}),  # model.id_mapping=managed
    }
