"""The report's baselines beside popularity: EASE (a memory plan, λ tuned on valid), iALS (a grid on valid)
and the graph filter, alone and fused with the two-tower (the run's rankers and evaluation stage)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from recsys.evaluation.ease import ease_from_gram, gram_dtype, gram_matrix, tune_ease
from recsys.evaluation.ease_plan import (
    USABLE_MEMORY_SHARE,
    EasePlan,
    available_memory_bytes,
    ease_peak_bytes,
    factorisation_seconds,
    plan_ease,
)
from recsys.evaluation.ials import tune_ials
from recsys.evaluation.interactions import UserItemCSR
from recsys.evaluation.report.types import EvalInputs, ReportOptions
from recsys.evaluation.stage import evaluate_rankers
from recsys.rankers.base import EvalSplit
from recsys.rankers.registry import RankerContext, build_rankers

log = logging.getLogger("recsys.evaluation.report")


def fit_ease(inputs: EvalInputs, options: ReportOptions, num_items: int) -> tuple[Any, dict]:
    """EASE's B [I, I] (None when skipped) and the report's "ease" block: a memory plan, λ on valid, one B for every split."""
    ease_b, ease_info = None, _ease_skip_reason(inputs, options, num_items)
    if ease_info is None:
        ease_device, plan = _plan_ease(inputs.train, options)
        too_slow = None if plan.dtype is None else _ease_too_slow(num_items, plan, ease_device, options)
        if plan.dtype is None or too_slow:
            ease_info = {"skipped": plan.skipped or too_slow, "device": ease_device, **plan.describe()}
        else:
            valid = inputs.splits["valid"]
            # keeping the best B through the sweep saves refitting it (an O(I³) factorisation) when
            # one more float32 [I, I] matrix fits too
            keep_best = plan.available_bytes is not None and ease_peak_bytes(
                num_items, plan.dtype, num_users=inputs.train.num_users, chunk_size=options.chunk_size, keep_best=True
            ) <= USABLE_MEMORY_SHARE * plan.available_bytes  # fmt: skip
            log.info(
                "EASE: Gram matrix of %d items (%s), λ tuned on valid over %s",
                num_items,
                plan.dtype,
                list(options.ease_lambdas),
            )
            gram = gram_matrix(inputs.train, dtype=gram_dtype(inputs.train.num_users, plan.dtype), device=ease_device)
            tuning = tune_ease(
                inputs.train, valid.exclude, valid.relevant, lambdas=options.ease_lambdas, k=options.ease_tune_k,
                max_users=options.ease_tune_users, seed=options.seed, chunk_size=options.chunk_size, dtype=plan.dtype,
                device=ease_device, gram=gram, keep_best=keep_best,
            )  # fmt: skip
            if tuning.b is not None:
                ease_b = tuning.b
            else:  # refitted in G's memory when the dtypes match
                ease_b = ease_from_gram(gram, tuning.best_lambda, dtype=plan.dtype, overwrite=True)
            del gram
            tuning.b = None  # ease_b holds it
            ease_info = {
                "lambda": tuning.best_lambda,
                "tuned_on": f"valid {tuning.metric}, {tuning.num_users} users",
                "grid": {str(lam): value for lam, value in tuning.scores.items()},
                "fit_on": "train interactions (binary); input row = the user's masked items",
                "device": ease_device,
                "best_b_kept": keep_best,
                **plan.describe(),
            }
    return ease_b, ease_info


def _ease_too_slow(num_items: int, plan: EasePlan, device: str, options: ReportOptions) -> str | None:
    """Why the λ sweep would take longer than ``options.ease_max_minutes`` (None: it would not): each λ is an O(I³)
    factorisation, hours for a few λ at tens of thousands of items on a small host (docs/evaluation.md)."""
    if not options.ease_max_minutes:
        return None
    per_lambda = options.ease_seconds_per_lambda
    if per_lambda is None:
        per_lambda = factorisation_seconds(num_items, plan.dtype, device)
    factorisations = len(options.ease_lambdas) + 1  # the sweep, then the best λ refitted (unless kept: a bound)
    minutes = per_lambda * factorisations / 60
    if minutes <= options.ease_max_minutes:
        return None
    return (
        f"the λ sweep would take ~{minutes:.0f} min here (> ease_max_minutes={options.ease_max_minutes:g}): "
        f"{factorisations} O(I³) factorisations of {num_items:,} items at ~{per_lambda / 60:.1f} min each (timed "
        "on a probe); give fewer ease_lambdas, or raise ease_max_minutes"
    )


def _plan_ease(train: UserItemCSR, options: ReportOptions) -> tuple[str, EasePlan]:
    """Where and in which dtype EASE fits: on ``options.device`` when its free memory allows, else on
    the CPU (a GPU rarely holds the I x I matrices of a large catalogue); the plan that ran last
    (the CPU's) when neither fits."""
    devices = [options.device] + (["cpu"] if torch.device(options.device).type != "cpu" else [])
    for device in devices:
        available = options.ease_available_bytes
        if available is None:
            available = available_memory_bytes(device)
        plan = plan_ease(train.num_items, train.num_users, available, chunk_size=options.chunk_size)
        if plan.dtype is not None:
            break
    return device, plan


def fit_ials(inputs: EvalInputs, options: ReportOptions) -> tuple[Any, dict]:
    """iALS tuned on valid (``tune_ials``): the best grid point's model and the report's "ials" block."""
    if not options.ials:
        return None, {"skipped": "iALS disabled (ReportOptions.ials=False)"}
    if "valid" not in inputs.splits:
        return None, {"skipped": "no 'valid' split given to tune iALS on"}
    valid = inputs.splits["valid"]
    log.info(
        "iALS: %d factors, λ %s x α %s tuned on valid",
        options.ials_factors,
        list(options.ials_regularizations),
        list(options.ials_alphas),
    )
    try:
        tuning = tune_ials(
            inputs.train, valid.exclude, valid.relevant, regularizations=options.ials_regularizations, alphas=options.ials_alphas,
            factors=options.ials_factors, iterations=options.ials_iterations, k=options.ease_tune_k,
            max_users=options.ease_tune_users, seed=options.seed, chunk_size=options.chunk_size, device=options.device,
        )  # fmt: skip
    except ImportError as e:
        return None, {"skipped": str(e)}
    return tuning.model, {
        "regularization": tuning.best_regularization,
        "alpha": tuning.best_alpha,
        "factors": tuning.factors,
        "iterations": tuning.iterations,
        "seed": options.seed,
        "tuned_on": f"valid {tuning.metric}, {tuning.num_users} users",
        "grid": [
            {"regularization": reg, "alpha": alpha, tuning.metric: value}
            for (reg, alpha), value in tuning.scores.items()
        ],
        "tuning_seconds": round(tuning.seconds, 2),
        "fit_on": "train interactions (binary); user factors re-solved from the user's masked items",
        "library": "implicit (CPU, conjugate-gradient ALS)",
    }


def _ease_skip_reason(inputs: EvalInputs, options: ReportOptions, num_items: int) -> dict | None:
    if not options.ease:
        return {"skipped": "EASE disabled (ReportOptions.ease=False)"}
    if num_items > options.ease_max_items:
        gb = num_items**2 * 4 / 1e9
        return {
            "skipped": f"catalogue of {num_items} items > {options.ease_max_items}: B alone would be "
            f"{num_items}² float32 = {gb:.1f} GB and the inverse O(I³)"
        }
    if "valid" not in inputs.splits:
        return {"skipped": "no 'valid' split given to tune λ on"}
    return None


def rank_stage_rankers(inputs: EvalInputs, options: ReportOptions) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """``options.stage_rankers`` (the graph filter alone and fused with the two-tower, and any other ranker the run
    lists) through the run's evaluation stage (the same rankers, grids and fits as the run's, so a row means one
    thing everywhere): ({split: {ranker: top-k ids}}, the
    report's block: each ranker's fit, tuning and chosen point, or why skipped)."""
    if not options.graph_filter:
        return {}, {"skipped": "graph filter disabled (ReportOptions.graph_filter=False)"}
    if "valid" not in inputs.splits:
        return {}, {"skipped": "no 'valid' split given to tune the graph filter and the fusion on"}
    graphs = inputs.graphs or {"valid": inputs.train}
    if any(name not in graphs for name in inputs.splits):
        return {}, {
            "skipped": f"no interaction graph given for {', '.join(n for n in inputs.splits if n not in graphs)}"
        }
    start = time.perf_counter()
    items = torch.as_tensor(inputs.item_emb).float()
    context = RankerContext(
        eval=options.ranker_config,
        train_counts=np.bincount(inputs.train.indices, minlength=inputs.train.num_items),
        embeddings={n: (torch.as_tensor(s.user_emb).float(), items) for n, s in inputs.splits.items()},
        seed=options.seed,
        unranked_items=None if inputs.unranked_items is None else torch.from_numpy(inputs.unranked_items),
    )
    rankers, parts = build_rankers(list(options.stage_rankers), context)
    splits = {
        n: EvalSplit(n, s.users, s.exclude, graphs[n], s.relevant, tuple(s.masked_splits))
        for n, s in inputs.splits.items()
    }
    metric = options.ranker_config.valid_metric
    out = evaluate_rankers(
        rankers, valid=splits["valid"], test=splits.get("test", splits["valid"]), ks=inputs.ks, metric=metric,
        chunk_size=options.chunk_size, parts=parts, keep_ids=True,
    )  # fmt: skip
    kmax = max(inputs.ks)  # the stage ranks at least the tuning metric's cut-off: the report's own depth here
    ids = {
        n: {r: out["ids"]["valid" if n == "valid" else "test"][r][:, :kmax] for r in options.stage_rankers}
        for n in splits
    }
    return ids, {
        "rankers": out["rankers"],
        "tuned_on": f"valid {metric}",
        "seconds": round(time.perf_counter() - start, 1),
    }
