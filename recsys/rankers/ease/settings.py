"""EASE's settings (``eval.settings.ease``: conf/eval/rankers/ease.yaml), their rules, and its resource check: the
[I, I] matrices must fit in the memory available and the λ grid's O(I³) factorisations in the time allowed, both
refused before any training; and its cost estimate (``estimate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from recsys.config.need import Need
from recsys.rankers.cost import RankerCost
from recsys.rankers.ease.plan import factorisation_seconds, plan_ease
from recsys.rankers.ease.solve import SPARSE_DENSITY
from recsys.rankers.resources import Resources
from recsys.utils.choices import EASE_LAMBDAS


@dataclass
class EaseSettings:
    """Steck's EASE (recsys/rankers/ease/solve.py): B = I - P diagMat(1 / diag P), P = (X'X + λI)^-1, scores x_u B."""

    # the λ grid chosen on valid: each value one O(I³) factorisation per split, so large catalogues may want fewer
    lambdas: list[float] = field(default_factory=lambda: list(EASE_LAMBDAS))
    max_items: int = 50_000  # larger catalogues are refused: B alone is I² float32
    # refused when the factorisations (the grid on valid, one λ for test) would take longer than this, each timed on
    # a probe and scaled by I³; 0 = no limit
    max_minutes: float = 60.0
    # served (alone, or as a fusion's part) up to this many items: its item vectors are I x I float32 and a fusion's
    # covariance of them I x I float64, 12 I² bytes in the bundle (docs/quality.md, "EASE in the served fusion")
    max_served_items: int = 8_192


def check_settings(s: EaseSettings, need: Need, key: str) -> None:
    need(len(s.lambdas) > 0 and all(v > 0 for v in s.lambdas), f"{key}.lambdas", list(s.lambdas), "must be values > 0")
    need(s.max_items >= 1, f"{key}.max_items", s.max_items, "must be >= 1")
    need(s.max_minutes >= 0, f"{key}.max_minutes", s.max_minutes, "must be >= 0 (0: no limit)")
    need(s.max_served_items >= 0, f"{key}.max_served_items", s.max_served_items, "must be >= 0 (0: never served)")


def check_resources(s: EaseSettings, r: Resources, key: str) -> str:
    """The refusal of a fit that would not fit in memory or time ("" when it would)."""
    if "ease" in r.served_parts and r.num_items > s.max_served_items:
        return (
            f"{key}.max_served_items={s.max_served_items}: EASE over {r.num_items:,} items is not served (its item "
            f"vectors are I x I, {12 * r.num_items**2 / 2**30:.1f} GiB in a fused bundle): serve or fuse another ranker"
        )
    if r.num_items > s.max_items:
        return f"{key}.max_items={s.max_items}: EASE over {r.num_items:,} items needs an [I, I] inverse; raise it or drop ease"
    plan = plan_ease(r.num_items, r.num_users, r.available_bytes)
    if plan.dtype is None:
        return f"eval.rankers lists ease, whose fit {plan.skipped}: drop it from eval.rankers"
    if s.max_minutes:
        minutes = factorisation_seconds(r.num_items, plan.dtype) * (len(s.lambdas) + 1) / 60
        if minutes > s.max_minutes:
            return (
                f"{key}.max_minutes={s.max_minutes:g}: EASE's {len(s.lambdas)} λ on valid and one for test over "
                f"{r.num_items:,} items would take about {minutes:.0f} minutes here; fewer {key}.lambdas, a larger "
                "max_minutes, or drop ease"
            )
    return ""


def estimate(s: EaseSettings, r: Resources) -> RankerCost:
    """Its fit, X'X (2 nnz I FLOPs through a sparse product), and per λ one factorisation (I³ FLOPs in the dtype
    ``plan_ease`` picks) and a pass over the users: a sparse history block times B (2 x the mean history x I FLOPs a
    user) on valid's grid, or where the history is dense or at one point of a servable catalogue, a dense one (2 I)."""
    t = r.throughput
    items, users = r.num_items, max(r.num_users, 1)
    plan = plan_ease(items, users, r.available_bytes)
    dtype = plan.dtype or torch.float32
    rate = t.factor64_gflops if dtype == torch.float64 else t.factor32_gflops
    mean_history = r.interactions / users
    dense = t.dense(2 * items)
    sparse = dense if mean_history > SPARSE_DENSITY * items else t.sparse(2 * mean_history)
    return RankerCost(
        fit_seconds=t.sparse(2 * r.interactions * items),
        peak_bytes=plan.peak_bytes,
        score_s=sparse,
        test_score_s=dense if items <= s.max_served_items else sparse,
        width=items,
        points=len(s.lambdas),
        passes=len(s.lambdas),
        pass_seconds=items**3 / (rate * 1e9 * t.threads),
        one_point_per_pass=True,
        what=f"{len(s.lambdas)} λ in {str(dtype).removeprefix('torch.')}",
    )
