"""The run plan: what a run decided once its dataset was opened, before the model is built (torchrec's planner hands
DistributedModelParallel a ShardingPlan the same way). It is resolved once (:func:`resolve_plan`), logged once
(:meth:`RunPlan.log`) and handed down: the model, the batches and the evaluator take its ``layout``; the evaluation
stage its ``stage_cfg``; the run its ``refit``. No layer below re-derives these from the config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from recsys.config import Config, query_layout
from recsys.data.dataset import RetrievalData
from recsys.data.layout import FeatureLayout, data_layout
from recsys.job.ranker_choice import serve_candidates
from recsys.job.refit_rule import decide_refit
from recsys.job.run_stage import plan_run_stage, stage_resources
from recsys.rankers.resources import Resources
from recsys.rankers.stage_cost import StagePlan
from recsys.rundir.results import split_counts


def run_layout(cfg: Config, data: RetrievalData) -> FeatureLayout:
    """The feature layout of ``cfg``'s switches (user id, sequence, query neighbours, history length) over the data
    it was opened with (recsys.job.assemble.open_dataset); a dataset opened without the neighbours the config asks
    for (or with ones it does not) is refused here, before any model is built."""
    if data.has_neighbors != (cfg.data.item_neighbors > 0):
        raise ValueError(
            f"data.item_neighbors={cfg.data.item_neighbors} but the dataset was loaded "
            f"{'with' if data.has_neighbors else 'without'} item neighbours: open it with "
            "recsys.job.assemble.open_dataset(cfg, root)"
        )
    return data_layout(data, cfg.data.history_length, **query_layout(cfg))


@dataclass(frozen=True)
class RunPlan:
    """A run's decisions over its opened dataset (frozen: each is made here once)."""

    layout: FeatureLayout  # every KJT key's tower, table and rows: the model, the batches, export and serving read it
    stage: (
        StagePlan  # the evaluation stage's rankers and settings as fitted to this host (recsys/rankers/stage_cost.py)
    )
    stage_cfg: Config  # the run's config ranking what ``stage`` chose (what the rankers read their settings from)
    serve_candidates: tuple[str, ...]  # the headline and the bundle: the one, or the best on valid of these
    refit: bool  # a second training on train + valid after the selection (trainer.refit resolved)
    refit_reason: str
    resources: Resources  # the sizes and the host memory the stage's estimates and checks see

    def log(self, logger: logging.Logger) -> None:
        """The plan, once, on rank 0, before the model is built."""
        logger.info("feature layout (key, tower, table, row source):\n%s", self.layout.describe())
        logger.info("refit: %s", self.refit_reason)
        self.stage.log(logger, self.resources.throughput.threads)
        candidates = self.serve_candidates
        logger.info(
            "evaluation stage: rankers %s; the headline and the bundle: %s",
            ", ".join(self.stage.names),
            candidates[0] if len(candidates) == 1 else f"the best on valid of {', '.join(candidates)}",
        )


def resolve_plan(cfg: Config, data: RetrievalData) -> RunPlan:
    """The plan of ``cfg`` over ``data`` (this rank's users with data.shard_by_user): the layout, the evaluation
    stage planned for this host (the default list fitted to it), the serve candidates and the refit rule's answer."""
    layout = run_layout(cfg, data)
    resources = stage_resources(cfg, data)
    stage_cfg, stage = plan_run_stage(cfg, resources)
    counts = split_counts(data)
    refit, reason = decide_refit(cfg, counts["train"], counts.get("valid", 0))
    if cfg.data.train_on_valid and not refit:  # a refit's second stage (or a run asked to train on valid)
        reason = "data.train_on_valid: this training holds the valid rows, no refit after it"
    return RunPlan(
        layout=layout,
        stage=stage,
        stage_cfg=stage_cfg,
        serve_candidates=tuple(serve_candidates(stage_cfg, data.num_items)),
        refit=refit,
        refit_reason=reason,
        resources=resources,
    )
