"""The evaluation stage's cost model (recsys/rankers/cost.py, each ranker's ``estimate``) and the default list fitted to
it (recsys/rankers/stage_cost.py): the formulas scale as their FLOPs do, a default part out of proportion is run at a
lower graph-filter rank or left out with the reason logged, a listed one is kept with a warning."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from recsys.job.run_stage import plan_run_stage, with_plan
from recsys.rankers.cost import Throughput, fusion_points, ranking_seconds
from recsys.rankers.ease.settings import EaseSettings
from recsys.rankers.ease.settings import estimate as ease_estimate
from recsys.rankers.graph_filter.settings import GraphFilterSettings
from recsys.rankers.graph_filter.settings import estimate as graph_filter_estimate
from recsys.rankers.ials.settings import IalsSettings
from recsys.rankers.ials.settings import estimate as ials_estimate
from recsys.rankers.resources import Resources
from recsys.rankers.stage_cost import RANK_FLOOR, estimate_stage, plan_stage
from tests.helpers.config import tiny_config

RATES = Throughput(threads=2)  # fixed rates: the estimates below do not depend on the host running the test
DEFAULT = ["two_tower", "popularity", "two_tower+graph_filter"]


def resources(items: int = 40_000, users: int = 30_000, interactions: int = 1_000_000, **kw) -> Resources:
    kw = {"valid_users": users, "test_users": users, "available_bytes": 64 * 10**9, **kw}
    return Resources(items, users, interactions, throughput=RATES, **kw)


def test_ease_scales_as_its_inverse_and_its_matrices():
    """Twice the items: 8x the factorisation of each λ (I³), about 4x the memory (I² matrices)."""
    one, two = (ease_estimate(EaseSettings(), resources(items=i, available_bytes=None)) for i in (16_000, 32_000))
    assert two.pass_seconds == pytest.approx(8 * one.pass_seconds)
    assert 3.5 < two.peak_bytes / one.peak_bytes <= 4
    assert one.passes == one.points == len(EaseSettings().lambdas) and one.one_point_per_pass


def test_graph_filter_and_ials_scale_with_what_they_count():
    s = GraphFilterSettings()
    base = graph_filter_estimate(s, resources())
    assert graph_filter_estimate(s, resources(interactions=2_000_000)).fit_seconds > base.fit_seconds
    # dense in I x width^2, sparse in nnz x width, its eigh in width^3 alone: twice the items, under twice the time
    items = graph_filter_estimate(s, resources(items=80_000)).fit_seconds / base.fit_seconds
    assert 1.5 < items <= 2.0
    half = graph_filter_estimate(replace(s, rank=1024), resources())
    assert half.fit_seconds < 0.4 * base.fit_seconds and half.peak_bytes < 0.6 * base.peak_bytes
    assert half.score_s == pytest.approx(base.score_s * (1024 + 256) / (2048 + 256))
    ials = IalsSettings()
    one, two = (ials_estimate(ials, resources(interactions=n, users=10, items=10)) for n in (10**6, 2 * 10**6))
    assert two.pass_seconds == pytest.approx(2 * one.pass_seconds, rel=1e-3)
    assert one.points == len(ials.regularizations) * len(ials.alphas)


def test_a_ranking_scales_with_users_items_and_points():
    cost = graph_filter_estimate(GraphFilterSettings(), resources())
    base = ranking_seconds(cost, RATES, users=1000, items=2000, points=1)
    assert ranking_seconds(cost, RATES, users=2000, items=2000, points=1) == pytest.approx(
        2 * base - cost.pass_seconds, rel=1e-6
    )
    assert ranking_seconds(cost, RATES, users=1000, items=2000, points=4) > base
    two_tower = estimate_stage(["two_tower"], {}, resources()).parts["two_tower"]
    assert two_tower.fit_seconds == 0 and two_tower.valid_seconds == pytest.approx(two_tower.test_seconds)
    fusion = estimate_stage(DEFAULT, {}, resources()).parts["two_tower+graph_filter"]
    assert fusion.valid_seconds > fusion.test_seconds > two_tower.test_seconds
    assert fusion_points(cost, cost, [0.0, 0.1, 0.2]) == 3


def test_gowalla_keeps_its_rank_on_the_measured_host():
    """Gowalla's shape (41k items, 30k users, 810k interactions + valid, 256-d towers) on 2 threads: the default
    fusion fits the default bounds at rank 2048 (its quality: docs/quality.md)."""
    r = resources(items=40_981, users=29_858, interactions=810_128, valid_users=29_000, query_dim=256)
    r = replace(r, available_bytes=20 * 10**9, throughput=Throughput().on(2))
    plan = plan_stage(DEFAULT, {}, r, adaptable=DEFAULT, max_seconds=15 * 60, memory_share=0.5)
    assert plan.names == DEFAULT and plan.overrides == {} and not plan.notes


def test_the_default_list_lowers_the_graph_filter_rank_and_says_why(caplog):
    r = resources()
    at = {rank: estimate_stage(DEFAULT, {"graph_filter": {"rank": rank}}, r).parts["two_tower+graph_filter"].seconds
          for rank in (2048, 1024, 512)}  # fmt: skip
    bound = (at[512] + at[1024]) / 2  # 1024 is over it, 512 within
    plan = plan_stage(DEFAULT, {}, r, adaptable=DEFAULT, max_seconds=bound)
    assert plan.names == DEFAULT and plan.settings["graph_filter"]["rank"] == 512
    assert plan.overrides == {"graph_filter": {"rank": 512}} and not plan.warnings
    with caplog.at_level(logging.INFO):
        plan.log(logging.getLogger("recsys.test"), 2)
    text = caplog.text
    assert "eval.settings.graph_filter.rank=512 instead of 2048" in text
    assert "over eval.default_max_minutes" in text
    assert "two_tower+graph_filter (rank 512, 4 points on valid): about" in text  # the estimate line, at the rank run
    assert "two_tower: about" in text and "popularity: about" in text


def test_the_default_list_leaves_out_what_fits_at_no_rank():
    r = resources(available_bytes=10**9)  # 0.5 GB: the graph filter's blocks fit at no rank
    plan = plan_stage(DEFAULT, {}, r, adaptable=DEFAULT, memory_share=0.5)
    assert plan.names == ["two_tower", "popularity"] and "graph_filter" not in plan.overrides
    why = plan.left_out["two_tower+graph_filter"]
    assert f"at rank {RANK_FLOOR}" in why and "eval.default_max_memory_share=0.5" in why
    assert any("two_tower+graph_filter left out of the default list" in n for n in plan.notes)
    ease = ["two_tower", "popularity", "two_tower+ease"]
    plan = plan_stage(ease, {}, resources(items=4096), adaptable=ease, max_seconds=1.0)
    assert (
        plan.names == ["two_tower", "popularity"] and "over eval.default_max_minutes" in plan.left_out["two_tower+ease"]
    )


def test_a_listed_ranker_is_kept_with_a_warning(caplog):
    listed = ["two_tower", "popularity", "two_tower+graph_filter", "ease"]
    plan = plan_stage(listed, {}, resources(items=16_000), adaptable=(), max_seconds=60, memory_share=0.5)
    assert plan.names == listed and plan.overrides == {} and not plan.left_out
    with caplog.at_level(logging.INFO):
        plan.log(logging.getLogger("recsys.test"), 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith("ease: about") and "kept, eval.rankers lists it" in w for w in warnings)
    assert any(w.startswith("two_tower+graph_filter: about") for w in warnings)


def test_the_run_plans_its_default_list_once_and_a_refit_ranks_the_same():
    cfg = tiny_config()
    r = resources(items=300, users=400, interactions=20_000, available_bytes=10**6)  # 0.5 MB: the fusions over it
    planned, plan = plan_run_stage(cfg, r)
    assert planned.eval.rankers == ["two_tower", "popularity"] == plan.names
    assert set(plan.describe()["left_out"]) == {"two_tower+graph_filter", "two_tower+ease"}
    assert with_plan(cfg, plan.describe()).eval.rankers == ["two_tower", "popularity"]
    listed = replace(cfg, eval=replace(cfg.eval, rankers=["two_tower", "two_tower+graph_filter"]))
    planned, plan = plan_run_stage(listed, r)
    assert planned.eval.rankers == ["two_tower", "two_tower+graph_filter"] and plan.warnings
    lowered = {"rankers": ["two_tower", "two_tower+graph_filter"], "settings": {"graph_filter": {"rank": 512}}}
    assert with_plan(cfg, lowered).eval.settings["graph_filter"]["rank"] == 512
    unbounded = replace(cfg, eval=replace(cfg.eval, default_max_memory_share=0.0, default_max_minutes=0.0))
    assert plan_run_stage(unbounded, r)[1].names == [
        "two_tower",
        "popularity",
        "two_tower+graph_filter",
        "two_tower+ease",
    ]
