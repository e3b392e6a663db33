"""The run's evaluation stage after training: embed the valid and test users (every rank, collectively), then rank
both splits with the configured rankers (``recsys.evaluation.stage``) on rank 0, and keep what the bundle serves.

    results = rank_after_training(cfg, env, data, two_tower, run_dir, evaluator)   # the same dict on every rank

With ``data.shard_by_user`` every rank ranks its own users and the metrics are combined across ranks; the graph
filter is fit from every rank's rows without any rank holding them all (its sums over users are all-reduced:
``recsys.rankers.graph_filter.spectral``).
The served ranker's test-stage state goes to ``<run dir>/served/`` (rank 0), for ``recsys.export``.

Before training the run plans the stage once (``plan_run_stage``): each ranker's cost on this dataset and host, and the
default list fitted to it (recsys/rankers/stage_cost.py); the planned config is what the stage ranks with.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from recsys.config import Config, IdMapping, query_not_exportable
from recsys.data.dataset import RetrievalData
from recsys.distributed.env import DistEnv
from recsys.evaluation.stage import evaluate_rankers, served_on_valid
from recsys.job.ranker_choice import resolved_rankers, serve_candidates
from recsys.rankers.base import EvalSplit, Point
from recsys.rankers.ease.plan import available_memory_bytes
from recsys.rankers.registry import TRAINED, RankerContext, build_rankers
from recsys.rankers.resources import Resources
from recsys.rankers.served_dir import save_served
from recsys.rankers.stage_cost import StageEstimate, StagePlan, plan_stage
from recsys.ranking.metrics import PER_USER_METRICS, per_user_metrics
from recsys.ranking.sharded import PRECEDING_SPLITS, Evaluator, metrics_over_ranks
from recsys.ranking.untrained import count_untrained, find_untrained, say_untrained

log = logging.getLogger(__name__)


def sum_over_ranks(device, world_size: int):
    """A ``Reduce`` (recsys.rankers.graph_filter.spectral): a tensor summed over the ranks, on ``device`` for the collective."""
    if world_size == 1:
        return None

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        moved = tensor.to(device)
        dist.all_reduce(moved)
        return moved.to(tensor.device)

    return reduce


def stage_resources(cfg: Config, data: RetrievalData) -> Resources:
    """What the stage's resource checks and cost estimates see, from the opened dataset, before training: the sizes
    its fits and rankings will have (this rank's users with data.shard_by_user) and the host's memory."""

    def users(split: str) -> int:
        return int(len(np.unique(data.splits[split].user_ids))) if split in data.splits else 0

    return Resources(
        num_items=data.num_items,
        num_users=data.num_users,
        interactions=sum(len(data.splits[s]) for s in ("train", "valid") if s in data.splits),
        fits_per_host=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if cfg.data.shard_by_user else 1,
        available_bytes=available_memory_bytes("cpu"),  # the fits run on the host, whatever the device
        valid_users=0 if cfg.data.train_on_valid else users("valid"),
        test_users=users("test"),
        query_dim=cfg.model.tower_dims[-1],
        chunk_size=cfg.eval.chunk_size,
    )


def plan_run_stage(cfg: Config, resources: Resources) -> tuple[Config, StagePlan]:
    """(``cfg`` ranking what the plan chose, the plan): the resolved rankers' costs, and where eval.rankers is null the
    default list fitted to eval.default_max_minutes and eval.default_max_memory_share (recsys/rankers/stage_cost.py)."""
    e = cfg.eval
    names = resolved_rankers(cfg, resources.num_items)
    plan = plan_stage(
        names, e.settings, resources, adaptable=names if e.rankers is None else (),
        max_seconds=60 * e.default_max_minutes, memory_share=e.default_max_memory_share,
    )  # fmt: skip
    return with_plan(cfg, plan.describe()), plan


def with_plan(cfg: Config, plan: Mapping[str, Any]) -> Config:
    """``cfg`` ranking what a plan chose (``StagePlan.describe()``, results.json's "evaluation_plan"): its rankers, and
    the settings it changed (the graph filter's rank); a refit ranks what its selection stage planned."""
    settings = dict(cfg.eval.settings)
    for name, changed in plan.get("settings", {}).items():
        settings[name] = {**dict(settings.get(name) or {}), **changed}
    return replace(cfg, eval=replace(cfg.eval, rankers=list(plan["rankers"]), settings=settings))


def rank_after_training(
    cfg: Config,
    env: DistEnv,
    data: RetrievalData,
    two_tower: nn.Module,
    run_dir: Path,
    evaluator: Evaluator,
    *,
    chosen: dict[str, Point] | None = None,
    estimate: StageEstimate | None = None,
) -> dict[str, Any]:
    """Collective: ``{"valid", "test", "rankers", "headline", "untrained"}`` of the trained ``two_tower`` and the
    configured rankers (``untrained``: the test users and items it never trained, recsys/ranking/untrained.py),
    its users embedded by the run's ``evaluator`` (recsys.job.assemble.run_evaluator; with per-rank users, each rank ranks
    its own); ``estimate``: the plan's, for the progress lines' ETAs."""
    ecfg, per_rank_users = cfg.eval, evaluator.per_rank_users
    splits = [s for s in ("valid", "test") if not (s == "valid" and cfg.data.train_on_valid)]
    embedded = {
        s: evaluator.embeddings(two_tower, s, device=env.device, rank=env.rank, world_size=env.world_size)
        for s in splits
    }
    untrained = find_untrained(
        data, two_tower, managed=cfg.model.id_mapping == IdMapping.managed, device=env.device, world_size=env.world_size
    )
    names = resolved_rankers(cfg, data.num_items)
    candidates = [n for n in serve_candidates(cfg, data.num_items) if n in names]
    results: list[Any] = [None]
    if per_rank_users or env.is_main:
        eval_splits, context = _splits_and_context(cfg, env, data, evaluator, embedded, untrained)
        rankers, parts = build_rankers(names, context)
        score = partial(metrics_over_ranks, device=env.device, world_size=env.world_size) if per_rank_users else None
        out = evaluate_rankers(
            rankers, valid=eval_splits.get("valid"), test=eval_splits["test"], ks=ecfg.ks, metric=ecfg.valid_metric,
            chunk_size=ecfg.chunk_size, chosen=chosen or {}, parts=parts, serve=candidates, estimate=estimate,
            **({"score": score} if score else {}),
        )  # fmt: skip
        serve = _save_served(out, eval_splits["test"], run_dir, env.is_main)
        out["headline"] = {"ranker": serve, "servable": True}
        mark_not_exportable(out, query_not_exportable(cfg))
        test = eval_splits["test"]
        out["untrained"] = {"test": count_untrained(untrained, test.users, test.relevant, context.reduce)}
        if env.is_main:
            say_untrained("test", out["untrained"]["test"])
        results[0] = out
    if env.world_size > 1 and not per_rank_users:
        dist.broadcast_object_list(results, src=0)
    return results[0]


def _splits_and_context(cfg: Config, env: DistEnv, data: RetrievalData, evaluator: Evaluator, embedded, untrained):
    """The rankers' view of each embedded split (``embedded``: split -> (protocol, users' vectors, items' vectors))
    and what they are built from (``RankerContext``)."""
    splits = {
        s: EvalSplit(s, p.users, p.exclude, evaluator.csr(p.timeline), p.relevant, PRECEDING_SPLITS[s])
        for s, (p, _, _) in embedded.items()
    }
    context = RankerContext(
        eval=cfg.eval,
        train_counts=data.item_counts(),
        trained_on="train + valid" if cfg.data.train_on_valid else "train",
        embeddings={s: (users, items) for s, (_, users, items) in embedded.items()},
        seed=cfg.trainer.seed,
        reduce=sum_over_ranks(env.device, env.world_size) if evaluator.per_rank_users else None,
        unranked_items=untrained.unranked_items(),
    )
    return splits, context


def _save_served(out: dict, test: EvalSplit, run_dir: Path, is_main: bool) -> str:
    """The served ranker (the stage's choice, else the two-tower); its test-stage state into ``<run dir>/served/``
    (rank 0), for ``recsys.export``."""
    kept, serve = out.pop("kept"), out.pop("served", TRAINED)
    if serve in kept and is_main:
        fit, ids = kept[serve]
        point = out["rankers"][serve]["point"]
        save_served(run_dir, serve, point, fit.served(point), fit_on=test.fit_on, users=test.users, topk=ids)
    return serve


def mark_not_exportable(out: dict, why: str) -> None:
    """Where the bundle cannot serve the run's query encoder (``why``, recsys.config.query_not_exportable), the
    two-tower and its fusions are not servable: their rows and the headline say so (recsys.export refuses the run)."""
    if not why:
        return
    for name, row in [*out["rankers"].items(), (out["headline"]["ranker"], out["headline"])]:
        if TRAINED in name.split("+"):  # the two-tower, or a fusion with it as either part
            row.update(servable=False, not_servable=why)


# the fits a search's trials share (the rankers fit on the interactions alone): set while the search runs
_KEPT_FITS: ContextVar[dict | None] = ContextVar("kept_fits", default=None)


@contextmanager
def fits_kept_between_trainings() -> Iterator[None]:
    """Within it, ``trial_figure`` fits each ranker that reads no trained weights (the graph filter, EASE) once and
    reuses it in every later trial of the same data; the fits are released at its end."""
    token = _KEPT_FITS.set({})
    try:
        yield
    finally:
        _KEPT_FITS.reset(token)


def trial_figure(
    cfg: Config, env: DistEnv, data: RetrievalData, two_tower: nn.Module, evaluator: Evaluator
) -> dict | None:
    """Collective: what a search's trial is ranked by when its run would serve another ranker than the two-tower
    alone (the graph filter's fusion, by default, on the random-split protocols): ``{"ranker": the one its run's stage
    would serve, "valid": its valid eval.valid_metric, "users": (the valid users, each one's figure) or None}``,
    each ranker at its grid's best point on valid as the stage chooses it; None where the two-tower alone would be
    served (its per-epoch figure is the trial's then)."""
    names = resolved_rankers(cfg, data.num_items)
    candidates = [n for n in serve_candidates(cfg, data.num_items) if n in names]
    if candidates in ([], [TRAINED]):
        return None
    ecfg, per_rank_users = cfg.eval, evaluator.per_rank_users
    embedded = {
        "valid": evaluator.embeddings(two_tower, "valid", device=env.device, rank=env.rank, world_size=env.world_size)
    }
    untrained = find_untrained(
        data, two_tower, managed=cfg.model.id_mapping == IdMapping.managed, device=env.device, world_size=env.world_size
    )
    results: list[Any] = [None]
    if per_rank_users or env.is_main:
        eval_splits, context = _splits_and_context(cfg, env, data, evaluator, embedded, untrained)
        valid = eval_splits["valid"]
        rankers, parts = build_rankers(candidates, context)
        score = partial(metrics_over_ranks, device=env.device, world_size=env.world_size) if per_rank_users else None
        served, metrics, ids = served_on_valid(
            rankers, valid=valid, candidates=candidates, ks=ecfg.ks, metric=ecfg.valid_metric,
            chunk_size=ecfg.chunk_size, parts=parts, kept_fits=_KEPT_FITS.get(), **({"score": score} if score else {}),
        )  # fmt: skip
        metric = ecfg.valid_metric
        results[0] = {"ranker": served, "valid": metrics[metric], "users": None}
        if metric.partition("@")[0] in PER_USER_METRICS:  # the paired comparison's figures
            evaluated = valid.relevant.lengths() > 0
            figures = per_user_metrics(ids, valid.relevant, [int(metric.partition("@")[2])])[metric]
            results[0]["users"] = (valid.users[evaluated], figures[evaluated])
            if per_rank_users and env.world_size > 1:  # every rank's users, on every rank
                results[0]["users"] = _gathered(results[0]["users"], env.world_size)
    if env.world_size > 1 and not per_rank_users:
        dist.broadcast_object_list(results, src=0)
    return results[0]


def _gathered(users_figures: tuple[np.ndarray, np.ndarray], world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Collective: every rank's (users, figures), concatenated in the order of the users."""
    shares: list[Any] = [None] * world_size
    dist.all_gather_object(shares, users_figures)
    users, figures = (np.concatenate(parts) for parts in zip(*shares, strict=True))
    order = np.argsort(users, kind="stable")
    return users[order], figures[order]
