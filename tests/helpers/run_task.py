"""A run's model as the run builds it: its plan's layout over the data (recsys.job.plan.run_layout), then build_task."""

from __future__ import annotations

from recsys.job.plan import run_layout
from recsys.model.build import build_task


def run_task(cfg, data, **kwargs):
    return build_task(cfg.model, data, run_layout(cfg, data), seed=cfg.trainer.seed, **kwargs)
