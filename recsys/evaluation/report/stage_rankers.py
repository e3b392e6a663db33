"""The report's rankers beside the model and popularity (recsys.evaluate's rankers=..., by default the rankers the
registry names for a report: REPORT_BASELINES), all through the evaluation stage (recsys.evaluation.stage: the same
rankers, settings, grids and fits as the run's, each tuned on valid and refit on the interactions test follows), so
that a row means one thing in results.json and in the report. The stage's cost is planned first (each part's estimated
time and memory logged; a part of the default list out of proportion lowered or left out: recsys/rankers/stage_cost.py);
a ranker whose resource check refuses it (EASE's memory or time, iALS without its library) is left out, its row
in report.json's "stage" saying why."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from recsys.evaluation.report.types import EvalInputs, ReportOptions
from recsys.evaluation.stage import evaluate_rankers
from recsys.rankers.base import EvalSplit
from recsys.rankers.ease.plan import available_memory_bytes
from recsys.rankers.registry import POPULARITY, SETTINGS, RankerContext, build_rankers, ranker_specs, settings_of
from recsys.rankers.resources import Resources
from recsys.rankers.stage_cost import StagePlan, plan_stage

log = logging.getLogger("recsys.evaluation.report")


def stage_names(options: ReportOptions) -> list[str]:
    """The rankers the report ranks through the stage, each once: popularity (every report's floor) first."""
    return list(dict.fromkeys([POPULARITY, *options.stage_rankers]))


def _plan(names: list[str], inputs: EvalInputs, options: ReportOptions) -> StagePlan:
    """The stage's cost on this report's data and host, the default rankers fitted to the run's bounds, logged."""
    train, e = inputs.train, options.ranker_config
    available = options.available_bytes if options.available_bytes is not None else available_memory_bytes()
    users = {name: len(split.users) for name, split in inputs.splits.items()}
    resources = Resources(
        train.num_items, train.num_users, max(int(g.nnz) for g in (inputs.graphs or {"valid": train}).values()),
        available_bytes=available, valid_users=users.get("valid", 0), test_users=users.get("test", 0),
        query_dim=int(np.shape(inputs.item_emb)[1]), chunk_size=options.chunk_size,
    )  # fmt: skip
    plan = plan_stage(
        names, e.settings, resources, adaptable=options.default_rankers,
        max_seconds=60 * e.default_max_minutes, memory_share=e.default_max_memory_share,
    )  # fmt: skip
    plan.log(log, resources.throughput.threads)
    return plan


def _refused(names: list[str], inputs: EvalInputs, options: ReportOptions) -> dict[str, str]:
    """Ranker -> why its resource check refuses it (memory, time, a missing library) on this report's data; a
    fusion's parts are checked as served parts (the report serves nothing else)."""
    train = inputs.train
    available = options.available_bytes if options.available_bytes is not None else available_memory_bytes()
    out = {}
    for name in names:
        parts = name.split("+")
        resources = Resources(
            train.num_items, train.num_users, int(train.nnz), available_bytes=available,
            served_parts=frozenset(parts if len(parts) > 1 else ()),
        )  # fmt: skip
        for part in parts:
            spec = ranker_specs().get(part)
            if spec is not None and spec.resources is not None and name not in out:
                why = spec.resources(settings_of(part, options.ranker_config.settings), resources, f"{SETTINGS}.{part}")
                if why:
                    out[name] = why
    return out


def rank_stage_rankers(inputs: EvalInputs, options: ReportOptions) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """The stage's rankers (``stage_names``): ({split: {ranker: top-k ids}}, {"rankers": each one's results.json
    row or {"skipped": why}, "tuned_on", "seconds"})."""
    names = stage_names(options)
    if not names:
        return {}, {"rankers": {}}
    why = _missing_inputs(inputs)
    if why:
        return {}, {"rankers": {n: {"skipped": why} for n in names}}
    plan = _plan(names, inputs, options)
    options = replace(options, ranker_config=replace(options.ranker_config, settings=plan.settings))
    skipped = {**plan.left_out, **_refused(plan.names, inputs, options)}
    ranked = [n for n in names if n not in skipped]
    for name, reason in skipped.items():
        if name not in plan.left_out:  # the plan logged its own
            log.info("%s skipped: %s", name, reason)
    start = time.perf_counter()
    ids, rows = _evaluate(ranked, inputs, options, plan) if ranked else ({}, {})
    return ids, {
        "plan": plan.describe(),
        "rankers": {n: rows[n] if n in rows else {"skipped": skipped[n]} for n in names},
        "tuned_on": f"valid {options.ranker_config.valid_metric}",
        "seconds": round(time.perf_counter() - start, 1),
    }


NO_VALID = "no 'valid' split given to tune it on"


def _missing_inputs(inputs: EvalInputs) -> str:
    graphs = inputs.graphs or {"valid": inputs.train}
    missing = [n for n in inputs.splits if n not in graphs]
    return f"no interaction graph given for {', '.join(missing)}" if missing else ""


def _evaluate(
    names: list[str], inputs: EvalInputs, options: ReportOptions, plan: StagePlan | None = None
) -> tuple[dict, dict[str, Any]]:
    graphs = inputs.graphs or {"valid": inputs.train}
    items = torch.as_tensor(inputs.item_emb).float()
    context = RankerContext(
        eval=options.ranker_config,
        train_counts=inputs.item_counts(),  # the run's own counts: popularity's row is the run's
        embeddings={n: (torch.as_tensor(s.user_emb).float(), items) for n, s in inputs.splits.items()},
        seed=options.seed,
        unranked_items=None if inputs.unranked_items is None else torch.from_numpy(inputs.unranked_items),
        available_bytes=options.available_bytes,
    )
    rankers, parts = build_rankers(names, context)
    untuned = {}
    if "valid" not in inputs.splits:  # a ranker with one point (popularity) is ranked on test; one with a grid is not
        untuned = {r.name: {"skipped": NO_VALID} for r in rankers if len(r.grid()) > 1}
        rankers = [r for r in rankers if r.name not in untuned]
    splits = {
        n: EvalSplit(n, s.users, s.exclude, graphs[n], s.relevant, tuple(s.masked_splits))
        for n, s in inputs.splits.items()
    }
    metric = options.ranker_config.valid_metric
    out = evaluate_rankers(
        rankers, valid=splits.get("valid"), test=splits.get("test", splits.get("valid")), ks=inputs.ks, metric=metric,
        chunk_size=options.chunk_size, parts=parts, keep_ids=True, estimate=plan.estimate if plan else None,
    )  # fmt: skip
    kmax = max(inputs.ks)  # the stage ranks at least the tuning metric's cut-off: the report's own depth here
    ranked = [r.name for r in rankers]
    ids = {n: {r: out["ids"]["valid" if n == "valid" else "test"][r][:, :kmax] for r in ranked} for n in splits}
    return ids, {**out["rankers"], **untuned}
