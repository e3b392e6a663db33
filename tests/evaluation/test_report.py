"""The evaluation report end to end on synthetic arrays: files, numbers, protocol, parquet, names."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.config import EvalConfig
from recsys.evaluation.report import (
    EvalInputs,
    ReportOptions,
    SplitInputs,
    compute_report,
    evaluate_and_report,
    format_markdown,
)
from recsys.rankers.ease.plan import PROBE_ITEMS, ease_peak_bytes, factorisation_seconds
from recsys.rankers.ials.solve import fit_ials, ials_topk
from recsys.rankers.registry import DEFAULT_FUSION as FUSED_MODEL
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import compute_metrics
from recsys.ranking.retrieval import exact_topk, popularity_topk

NUM_USERS, NUM_ITEMS, DIM, KS = 120, 80, 8, [5, 10, 20]


def _inputs(dataset_dir=None) -> EvalInputs:
    rng = np.random.default_rng(0)
    pop = np.exp(rng.standard_normal(NUM_ITEMS))

    def draw(n: int) -> UserItemCSR:
        users = np.repeat(np.arange(NUM_USERS), n)
        items = rng.choice(NUM_ITEMS, size=NUM_USERS * n, p=pop / pop.sum())
        return UserItemCSR.from_pairs(users, items, num_users=NUM_USERS, num_items=NUM_ITEMS)

    train, valid, test = draw(12), draw(3), draw(3)
    item_emb = rng.standard_normal((NUM_ITEMS, DIM)).astype(np.float32)
    user_emb = rng.standard_normal((NUM_USERS, DIM)).astype(np.float32)
    valid_users = np.arange(NUM_USERS)
    test_users = np.arange(0, NUM_USERS, 2)  # a subset, not in id order of the full table
    splits = {
        "valid": SplitInputs(
            valid_users, user_emb, valid.select_rows(valid_users), train.select_rows(valid_users), ("train",)
        ),
        "test": SplitInputs(
            test_users,
            torch.from_numpy(user_emb[test_users]),
            test.select_rows(test_users),
            train.union(valid).select_rows(test_users),
            ("train", "valid"),
        ),  # fmt: skip
    }
    return EvalInputs(
        item_emb=item_emb,
        splits=splits,
        train=train,
        ks=KS,
        dataset_dir=dataset_dir,
        checkpoint="runs/x/checkpoints/epoch_3",
        graphs={"valid": train, "test": train.union(valid)},
    )


def _dataset_dir(tmp_path):
    root = tmp_path / "dataset"
    (root / "vocab").mkdir(parents=True)
    (root / "meta.json").write_text(
        json.dumps({"name": "toy", "protocol": "recbole", "counts": {"train": 1, "valid": 2, "test": 3}})
    )
    pd.DataFrame({"raw_id": [f"u{i}" for i in range(NUM_USERS)], "user_id": np.arange(NUM_USERS)}).to_parquet(
        root / "vocab" / "users.parquet"
    )
    pd.DataFrame(
        {
            "raw_id": np.arange(NUM_ITEMS) + 1000,
            "item_id": np.arange(NUM_ITEMS),
            "title": [f"Movie {i}" for i in range(NUM_ITEMS)],
        }
    ).to_parquet(root / "vocab" / "items.parquet")
    return root


SETTINGS = {
    # two low-pass weights (the default is one): the graph filter alone has a grid for valid to choose from
    "graph_filter": {"alphas": [0.1, 0.2]},
    "ease": {"lambdas": [1.0, 30.0]},
    "ials": {"regularizations": [0.1, 10.0], "alphas": [3.0, 30.0], "factors": 8, "iterations": 5},
}
OPTIONS = ReportOptions(
    ann_kinds=("flat", "hnsw"), num_seed_items=3, num_similar_items=4, ranker_config=EvalConfig(settings=SETTINGS)
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    inputs = _inputs(_dataset_dir(tmp))
    report = evaluate_and_report(inputs, tmp / "run", OPTIONS)
    return inputs, report, tmp / "run" / "eval"


def test_writes_every_file_and_no_temporaries(written):
    _, _, out = written
    assert sorted(p.name for p in out.iterdir()) == [
        "recall_at_k.png",
        "recommendations.parquet",
        "report.json",
        "report.md",
    ]
    assert (out / "recall_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_numbers_equal_compute_metrics(written):
    inputs, report, out = written
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == report
    for name, split in inputs.splits.items():
        _, ids = exact_topk(
            torch.as_tensor(split.user_emb), torch.from_numpy(inputs.item_emb), 20, exclude=split.exclude
        )
        expected = compute_metrics(ids.numpy(), split.relevant, KS, num_items=NUM_ITEMS)
        assert on_disk["splits"][name]["metrics"]["two_tower"] == pytest.approx(expected, rel=1e-12)
        counts = torch.from_numpy(np.bincount(inputs.train.indices, minlength=NUM_ITEMS))
        _, pop = popularity_topk(counts, split.relevant.num_users, 20, exclude=split.exclude)
        expected_pop = compute_metrics(pop.numpy(), split.relevant, KS, num_items=NUM_ITEMS)
        assert on_disk["splits"][name]["metrics"]["popularity"] == pytest.approx(expected_pop, rel=1e-12)
        assert set(on_disk["splits"][name]["metrics"]) == {
            "two_tower",
            "popularity",
            "ease",
            "ials",
            "graph_filter",
            FUSED_MODEL,
        }
        curve = on_disk["splits"][name]["recall_curve"]["two_tower"]
        assert len(curve) == 20 and curve[9] == pytest.approx(expected["recall@10"])
    assert on_disk["checkpoint"] == "runs/x/checkpoints/epoch_3"
    assert on_disk["dataset"]["counts"] == {"train": 1, "valid": 2, "test": 3}
    ease = on_disk["stage"]["rankers"]["ease"]
    assert ease["point"]["lambda"] in (1.0, 30.0) and set(ease["grid"]) == {"lambda=1", "lambda=30"}
    assert ease["grid"][f"lambda={ease['point']['lambda']:g}"] == max(ease["grid"].values())  # the best on valid
    assert ease["fit_on"] == {"valid": "train", "test": "train + valid"}  # refit for test, as the run does
    # one row per stage ranker, in the order asked for, each its results.json row
    # popularity, every report's floor, through the stage as the others
    assert list(on_disk["stage"]["rankers"]) == ["popularity", *dict.fromkeys(ReportOptions().stage_rankers)]
    assert on_disk["ann"]["indexes"]["flat"]["recall_vs_exact"] == 1.0
    assert 0.0 <= on_disk["ann"]["indexes"]["hnsw"]["recall_vs_exact"] <= 1.0
    assert len(on_disk["gaps"]) == 2 and "× popularity's" in on_disk["gaps"][1]
    for label in ("graph filter", "two-tower + graph filter", "EASE", "iALS"):  # each stage ranker's share, labelled
        assert f"% of {label}'s (" in on_disk["gaps"][1]


def test_markdown_states_the_protocol(written):
    _, report, out = written
    md = (out / "report.md").read_text()
    assert f"Full ranking over all {NUM_ITEMS} items" in md
    assert "each user's train and valid items are masked" in md
    assert report["gaps"][1] in md
    assert "## More like this" in md and "**Movie " in md  # named by title
    assert "![recall at K](recall_at_k.png)" in md


def test_recommendations_parquet(written):
    inputs, report, out = written
    recs = pd.read_parquet(out / "recommendations.parquet")
    test = inputs.splits["test"]
    assert list(recs.columns) == ["split", "user_id", "user_raw_id", "rank", "item_id", "item_raw_id", "title", "score"]
    assert len(recs) == 20 * test.relevant.num_users and (recs.groupby("user_id").size() == 20).all()
    assert set(recs["user_id"]) == set(test.users.tolist())
    first = recs[recs["user_id"] == test.users[1]].sort_values("rank")
    _, ids = exact_topk(
        torch.as_tensor(test.user_emb[1:2]),
        torch.from_numpy(inputs.item_emb),
        20,
        exclude=test.exclude.select_rows([1]),
    )
    assert first["item_id"].tolist() == ids[0].tolist()
    assert first["user_raw_id"].iloc[0] == f"u{test.users[1]}"
    assert (first["item_raw_id"] == first["item_id"] + 1000).all()
    assert first["title"].iloc[0] == f"Movie {first['item_id'].iloc[0]}"
    assert first["rank"].tolist() == list(range(1, 21)) and (np.diff(first["score"]) <= 0).all()


def test_more_like_this_uses_most_popular_items(written):
    inputs, report, _ = written
    counts = np.bincount(inputs.train.indices, minlength=NUM_ITEMS)
    seeds = [s["item_id"] for s in report["more_like_this"]]
    assert seeds == np.lexsort((np.arange(NUM_ITEMS), -counts))[:3].tolist()
    for seed in report["more_like_this"]:
        assert len(seed["nearest"]) == 4 and seed["item_id"] not in [n["item_id"] for n in seed["nearest"]]
        assert seed["name"] == f"Movie {seed['item_id']}"


def test_ease_and_ann_skipped_with_reasons(monkeypatch):
    import recsys.evaluation.report.compute as report_module

    def no_faiss(*args, **kwargs):
        raise ImportError("ANN evaluation needs FAISS ... pip install faiss-cpu")

    monkeypatch.setattr(report_module, "compare_ann", no_faiss)
    inputs = _inputs()  # no dataset dir: indices instead of raw ids, no titles
    small = EvalConfig(settings={"ease": {"max_items": 50}})
    result = compute_report(inputs, ReportOptions(ranker_config=small, num_seed_items=2, stage_rankers=["ease"]))
    assert result.report["stage"]["rankers"]["ease"]["skipped"].startswith(
        "eval.settings.ease.max_items=50: EASE over 80 items"
    )
    assert list(result.report["stage"]["rankers"]) == ["popularity", "ease"]  # the floor and the rankers asked for
    assert "pip install faiss-cpu" in result.report["ann"]["skipped"]
    assert set(result.report["splits"]["test"]["metrics"]) == {"two_tower", "popularity"}
    assert "EASE not run" in result.report["gaps"][0]
    assert list(result.recommendations.columns) == ["split", "user_id", "rank", "item_id", "score"]
    assert result.report["more_like_this"][0]["name"].startswith("item ")


def test_ials_block_and_its_numbers(written):
    inputs, report, out = written
    ials = report["stage"]["rankers"]["ials"]
    point = ials["point"]
    assert list(ials["grid"]) == [
        "regularization=0.1,alpha=3", "regularization=0.1,alpha=30", "regularization=10,alpha=3", "regularization=10,alpha=30"
    ]  # fmt: skip
    assert ials["grid"][f"regularization={point['regularization']:g},alpha={point['alpha']:g}"] == max(
        ials["grid"].values()
    )
    assert ials["fit"]["test"]["factors"] == 8 and ials["tuned_on"] == "valid recall@20, 120 users"
    # the report's iALS numbers are the stage's: the chosen point fit on the interactions each split follows (train
    # for valid, train + valid for test) and ranked with the same masking
    for name, split in inputs.splits.items():
        model = fit_ials(inputs.graphs[name], **point, factors=8, iterations=5, seed=0)
        _, ids = ials_topk(model, split.exclude, 20, exclude=split.exclude)
        expected = compute_metrics(ids.numpy(), split.relevant, KS, num_items=NUM_ITEMS)
        assert report["splits"][name]["metrics"]["ials"] == pytest.approx(expected, rel=1e-12)
    assert "% of iALS's" in report["gaps"][1]
    md = (out / "report.md").read_text()
    assert "### iALS (`ials`)" in md and "| iALS |" in md
    assert f"regularization = {point['regularization']:g}, alpha = {point['alpha']:g}, chosen by valid recall@20" in md
    ease = report["stage"]["rankers"]["ease"]
    assert "Test fit: dtype float64" in md and ease["fit"]["test"]["dtype"] == "float64"


def test_ease_runs_float32_or_skips_by_the_memory_it_is_given(written):
    _, full, _ = written
    inputs = _inputs()
    fast = dict(ranker_config=EvalConfig(settings=SETTINGS), ann_kinds=(), num_seed_items=0, stage_rankers=["ease"])
    need64 = ease_peak_bytes(NUM_ITEMS, torch.float64, num_users=NUM_USERS)
    need32 = ease_peak_bytes(NUM_ITEMS, torch.float32, num_users=NUM_USERS)
    full_ease = full["stage"]["rankers"]["ease"]
    assert full_ease["fit"]["test"]["dtype"] == "float64"
    half = compute_report(
        inputs, ReportOptions(available_bytes=int((need64 - 1) / 0.9), **fast)
    ).report  # / 0.9: the share a plan may use
    half_ease = half["stage"]["rankers"]["ease"]
    assert half_ease["fit"]["test"]["dtype"] == "float32" and half_ease["point"] == full_ease["point"]
    for name in inputs.splits:  # float32's top-k is float64's on this catalogue
        assert half["splits"][name]["metrics"]["ease"] == pytest.approx(
            full["splits"][name]["metrics"]["ease"], rel=1e-12
        )
    none = compute_report(inputs, ReportOptions(available_bytes=need32 // 2, **fast)).report
    assert (
        f"needs {need32 / 1e9:.1f} GB, have {need32 // 2 / 1e9:.1f} GB" in none["stage"]["rankers"]["ease"]["skipped"]
    )
    assert set(none["splits"]["test"]["metrics"]) == {"two_tower", "popularity"}
    assert "EASE skipped: eval.rankers lists ease, whose fit needs " in format_markdown(
        json.loads(json.dumps(none, default=float))
    )


def test_ease_skips_a_sweep_longer_than_its_time_budget(written, monkeypatch):
    """A large catalogue takes hours per λ on a small host: the report says so instead of running for a day; within
    the budget it runs as before."""
    import recsys.rankers.ease.settings as ease_settings

    _, full, _ = written
    inputs = _inputs()

    def report(minutes_per_lambda: float, max_minutes: float) -> dict:
        monkeypatch.setattr(ease_settings, "factorisation_seconds", lambda items, dtype: 60 * minutes_per_lambda)
        settings = {**SETTINGS, "ease": {"lambdas": [1.0, 30.0], "max_minutes": max_minutes}}
        options = ReportOptions(
            ranker_config=EvalConfig(settings=settings), ann_kinds=(), num_seed_items=0, stage_rankers=["ease"]
        )
        return compute_report(inputs, options).report

    slow = report(20.0, 30)
    # 3 factorisations (two λ on valid, the chosen one for test) x 20 min > 30 min
    skipped = slow["stage"]["rankers"]["ease"]["skipped"]
    assert skipped.startswith("eval.settings.ease.max_minutes=30: EASE's 2 λ on valid and one for test")
    assert "about 60 minutes here" in skipped and "ease" not in slow["splits"]["test"]["metrics"]
    assert "EASE skipped: eval.settings.ease.max_minutes=30" in format_markdown(
        json.loads(json.dumps(slow, default=float))
    )
    point = full["stage"]["rankers"]["ease"]["point"]
    assert report(1 / 60, 30)["stage"]["rankers"]["ease"]["point"] == point
    assert report(1e9, 0)["stage"]["rankers"]["ease"]["point"] == point  # 0: no limit


def test_factorisation_estimate_scales_with_the_cube_of_the_catalogue(monkeypatch):
    import recsys.rankers.ease.plan as ease_plan

    clock = iter([10.0, 12.0, 20.0, 20.5])  # the probe takes 2 s, then 0.5 s
    monkeypatch.setattr(ease_plan.time, "perf_counter", lambda: next(clock))
    # above the probe's size: the probe (PROBE_ITEMS) timed once and scaled by (I / probe)³
    assert factorisation_seconds(8 * PROBE_ITEMS, torch.float32) == pytest.approx(2.0 * 512)
    assert factorisation_seconds(300, torch.float32) == pytest.approx(0.5)  # a small catalogue is timed itself


def test_graph_filter_alone_and_fused_are_chosen_on_valid(written):
    """The graph filter alone (alpha, sharpening) and fused with the two-tower (and beta) are the best points of
    their valid grids, through the run's evaluation stage; the valid rows are those points' figures; beta = 0
    is the two-tower itself; each is fit on the interactions its split follows and says it is servable."""
    inputs, report, out = written
    gf = report["stage"]
    assert gf["tuned_on"] == "valid recall@20"
    alone, fused = gf["rankers"]["graph_filter"], gf["rankers"][FUSED_MODEL]
    assert alone["fit"]["valid"]["interactions"] == inputs.train.indices.size
    assert fused["fit"]["test"]["interactions"] == inputs.graphs["test"].nnz
    assert alone["fit_on"] == fused["fit_on"] == {"valid": "train", "test": "train + valid"}
    assert alone["grid"][f"alpha={alone['point']['alpha']:g},sharpen={alone['point']['sharpen']:g}"] == max(
        alone["grid"].values()
    )
    assert fused["grid"][",".join(f"{k}={v:g}" for k, v in fused["point"].items())] == max(fused["grid"].values())
    valid = report["splits"]["valid"]["metrics"]
    assert valid["graph_filter"]["recall@20"] == pytest.approx(max(alone["grid"].values()), abs=1e-12)
    assert valid[FUSED_MODEL]["recall@20"] == pytest.approx(max(fused["grid"].values()), abs=1e-12)
    assert fused["grid"]["alpha=0.1,sharpen=2.5,beta=0"] == pytest.approx(valid["two_tower"]["recall@20"], abs=1e-12)
    assert {"graph_filter", FUSED_MODEL} <= set(report["splits"]["test"]["metrics"])
    assert alone["servable"] and fused["servable"]
    md = (out / "report.md").read_text()
    assert "## The evaluation stage's rankers" in md and f"### two-tower + graph filter (`{FUSED_MODEL}`)" in md
    assert "fitted on train for valid and train + valid for test; servable by the bundle: yes." in md
    off = compute_report(inputs, ReportOptions(stage_rankers=[], ann_kinds=())).report
    assert "graph_filter" not in off["splits"]["test"]["metrics"] and list(off["stage"]["rankers"]) == ["popularity"]
    assert "### popularity" in format_markdown(json.loads(json.dumps(off, default=float)))


def test_without_valid_popularity_ranks_test_through_the_stage_and_a_grid_is_skipped():
    """A run that trained on its valid split is reported on test alone: popularity (one point) is ranked through the
    stage as the run ranked it (popularity_topk of the training counts), a ranker with a grid to choose is skipped
    saying why."""
    inputs = _inputs()
    inputs = EvalInputs(**{**inputs.__dict__, "splits": {"test": inputs.splits["test"]}})
    report = compute_report(inputs, ReportOptions(stage_rankers=["ease"], ann_kinds=())).report
    assert report["stage"]["rankers"]["ease"] == {"skipped": "no 'valid' split given to tune it on"}
    split = inputs.splits["test"]
    counts = torch.from_numpy(np.bincount(inputs.train.indices, minlength=NUM_ITEMS)).float()
    ids = popularity_topk(counts, len(split.users), max(KS), exclude=split.exclude, chunk_size=64)[1]
    expected = compute_metrics(ids.numpy(), split.relevant, KS, num_items=NUM_ITEMS)
    assert report["splits"]["test"]["metrics"]["popularity"] == pytest.approx(expected)
    assert set(report["splits"]["test"]["metrics"]) == {"two_tower", "popularity"}
