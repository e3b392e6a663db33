"""The graph filter as a dot product (recsys/rankers/graph_filter/spectral.py, graph_filter.py) and the fusion of rankers
(fusion.py): the spectrum against a dense eigendecomposition, the filter against GF-CF's and BSPM's dense
formulas (exact at full rank, the top of the spectrum below it), the fused vectors against the fused score,
beta = 0 ranking as the two-tower, the valid grid choosing the better ranking, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.evaluation.stage import evaluate_rankers
from recsys.job.ranker_choice import check_rankers
from recsys.rankers.base import EvalSplit, point_key
from recsys.rankers.fusion import FusionFit, FusionRanker
from recsys.rankers.graph_filter.ranker import GraphFilterFit, GraphFilterRanker, GraphFilterVectors
from recsys.rankers.graph_filter.settings import fit_peak_bytes
from recsys.rankers.graph_filter.spectral import fit_spectrum
from recsys.rankers.two_tower.ranker import TwoTowerFit, TwoTowerRanker
from recsys.ranking.interactions import UserItemCSR
from tests.helpers.config import tiny_config


def random_graph(num_users: int, num_items: int, per_user: int, seed: int) -> UserItemCSR:
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), per_user)
    items = np.concatenate([rng.choice(num_items, per_user, replace=False) for _ in range(num_users)])
    return UserItemCSR.from_pairs(users, items, num_users=num_users, num_items=num_items)


def dense(csr: UserItemCSR) -> np.ndarray:
    out = np.zeros((csr.num_users, csr.num_items))
    for u in range(csr.num_users):
        out[u, csr.row(u)] = 1.0
    return out


def gf_formulas(r: np.ndarray, k: int, alpha: float, sharpen: float) -> np.ndarray:
    """GF-CF's filter (linear + alpha * ideal low-pass on the top k), sharpened as BSPM: one RK4 step of
    dU/dt = -U P over [0, T], i.e. U(0) (I - hP + (hP)^2/2 - (hP)^3/6 + (hP)^4/24), h = T."""
    du, di = r.sum(1), r.sum(0)
    safe = lambda d: np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-12)), 0.0)  # noqa: E731
    norm = safe(du)[:, None] * r * safe(di)[None]
    p = norm.T @ norm
    _, vectors = np.linalg.eigh(p)
    top = vectors[:, ::-1][:, :k]
    low = r @ np.diag(safe(di)) @ top @ top.T @ np.diag(np.sqrt(di))
    h = sharpen * p
    step = np.eye(len(p)) - h + h @ h / 2 - h @ h @ h / 6 + h @ h @ h @ h / 24
    return (r @ p + alpha * low) @ step


def clustered_splits(num_users: int = 80, seed: int = 4) -> tuple[UserItemCSR, UserItemCSR, UserItemCSR]:
    """(train, valid, test) where every user keeps to one of 4 clusters of 10 items: their held-out items are
    the cluster's, which the graph knows and random embeddings do not."""
    rng = np.random.default_rng(seed)
    rows: list[list[tuple[int, int]]] = [[], [], []]
    for u in range(num_users):
        cluster = rng.permutation(10) + 10 * (u % 4)
        for split, items in enumerate((cluster[:6], cluster[6:8], cluster[8:10])):
            rows[split] += [(u, int(i)) for i in items]
    return tuple(UserItemCSR.from_pairs(*np.array(r).T, num_users=num_users, num_items=40) for r in rows)


def split_of(graph: UserItemCSR, relevant: UserItemCSR | None = None, name: str = "valid") -> EvalSplit:
    users = np.arange(graph.num_users)
    return EvalSplit(name, users, graph, graph, relevant if relevant is not None else graph, ("train",))


def test_the_spectrum_is_the_top_of_p_and_the_same_on_every_run():
    graph = random_graph(50, 40, 6, seed=0)
    r = dense(graph)
    du, di = r.sum(1), r.sum(0)
    norm = r / np.sqrt(du)[:, None] / np.sqrt(np.maximum(di, 1))[None]
    expected = np.sort(np.linalg.eigvalsh(norm.T @ norm))[::-1][:10]
    spectrum = fit_spectrum(graph, 10, iterations=6, oversample=20)
    np.testing.assert_allclose(spectrum.values.numpy(), expected, rtol=1e-4, atol=1e-5)
    v = spectrum.vectors.double().numpy()
    np.testing.assert_allclose(v.T @ v, np.eye(10), atol=1e-4)  # orthonormal
    again = fit_spectrum(graph, 10, iterations=6, oversample=20)
    assert torch.equal(again.vectors, spectrum.vectors)  # seeded: the same vectors, bit for bit


@pytest.mark.parametrize("alpha, sharpen", [(0.0, 0.0), (0.3, 2.5)])
def test_at_full_rank_the_dot_product_is_gf_cf_and_bspm_exactly(alpha, sharpen):
    graph = random_graph(60, 40, 6, seed=1)
    fit = GraphFilterFit(GraphFilterVectors.of(fit_spectrum(graph, 40, iterations=8, oversample=10), 5), 0.0)
    queries, items = fit.vectors(split_of(graph), {"alpha": alpha, "sharpen": sharpen})
    expected = gf_formulas(dense(graph), 5, alpha, sharpen)
    np.testing.assert_allclose((queries @ items.t()).numpy(), expected, rtol=1e-3, atol=1e-4)
    # the grid's score blocks are the same scores
    ((_, block),) = fit.score_blocks(split_of(graph), 10, 30, [{"alpha": alpha, "sharpen": sharpen}])
    np.testing.assert_allclose(block.numpy(), expected[10:30], rtol=1e-3, atol=1e-4)


def test_below_full_rank_the_linear_filter_keeps_the_top_of_the_spectrum():
    """rank m < I: the linear part is r V diag(lambda p(-T lambda)) V' over the top m eigenpairs."""
    graph = random_graph(60, 40, 6, seed=2)
    spectrum = fit_spectrum(graph, 12, iterations=8, oversample=20)
    fit = GraphFilterFit(GraphFilterVectors.of(spectrum, 4), 0.0)
    queries, items = fit.vectors(split_of(graph), {"alpha": 0.0, "sharpen": 0.0})
    r = dense(graph)
    v, lam = spectrum.vectors.double().numpy(), spectrum.values.numpy()
    np.testing.assert_allclose((queries @ items.t()).numpy(), r @ v @ np.diag(lam) @ v.T, rtol=1e-4, atol=1e-5)
    assert queries.shape == (60, 12 + 4) and items.shape == (40, 12 + 4)


def test_fused_vectors_rank_as_the_fused_score_and_beta_zero_as_the_two_tower():
    graph = random_graph(60, 40, 6, seed=3)
    gf = GraphFilterFit(GraphFilterVectors.of(fit_spectrum(graph, 40, iterations=8, oversample=10), 5), 0.0)
    generator = torch.Generator().manual_seed(0)
    tt = TwoTowerFit(torch.randn(60, 8, generator=generator), torch.randn(40, 8, generator=generator), "train")
    fused = FusionFit(tt, gf, first_keys=[])
    point = {"alpha": 0.3, "sharpen": 2.5, "beta": 0.4}
    queries, items = fused.vectors(split_of(graph), point)
    scores = (queries @ items.t()).double().numpy()
    cos, filtered = (tt.queries @ tt.items.t()).double().numpy(), gf_formulas(dense(graph), 5, 0.3, 2.5)
    expected = cos / cos.std(1, ddof=1, keepdims=True) + 0.4 * filtered / filtered.std(1, ddof=1, keepdims=True)
    # the same score up to a constant per user (the means the spread leaves in), which ranks the same
    np.testing.assert_allclose(
        scores - scores.mean(1, keepdims=True), expected - expected.mean(1, keepdims=True), atol=1e-4
    )
    ((_, block),) = fused.score_blocks(split_of(graph), 0, 60, [point])
    np.testing.assert_allclose(
        block.numpy() - block.numpy().mean(1, keepdims=True), expected - expected.mean(1, keepdims=True), atol=1e-4
    )
    top = fused.topk(split_of(graph), 5, [{**point, "beta": 0.0}], chunk_size=16)
    alone = tt.topk(split_of(graph), 5, [{}], chunk_size=16)
    assert torch.equal(top[point_key({**point, "beta": 0.0})], alone["-"])


def test_the_stage_chooses_on_valid_ranks_test_at_that_point_and_states_it():
    """A graph where the filter knows what the two-tower does not: the grid on valid picks a beta > 0, test is
    ranked at that point only, with the filter fit on train for valid and on train + valid for test."""
    train, valid_rel, test_rel = clustered_splits()
    generator = torch.Generator().manual_seed(1)
    embeddings = {
        s: (torch.randn(80, 8, generator=generator), torch.randn(40, 8, generator=generator)) for s in ("valid", "test")
    }
    two_tower = TwoTowerRanker(embeddings, "train")
    gf = GraphFilterRanker(
        alphas=[0.0, 0.3],
        sharpens=[0.0, 2.5],
        rank=40,
        low_rank=5,
        iterations=4,
        oversample=10,
    )
    fused = FusionRanker(two_tower, gf, [0.0, 0.5, 2.0])
    test_graph = train.union(valid_rel)
    valid = EvalSplit("valid", np.arange(80), train, train, valid_rel, ("train",))
    test = EvalSplit("test", np.arange(80), test_graph, test_graph, test_rel, ("train", "valid"))
    out = evaluate_rankers(
        [two_tower, fused], valid=valid, test=test, ks=[5, 10], metric="recall@10", parts=[gf], keep_ids=True
    )
    row = out["rankers"][fused.name]
    assert len(row["grid"]) == 1 + 2 * 2 * 2 and row["tuned_on"].startswith("valid recall@10")
    assert out["valid"][fused.name]["recall@10"] == pytest.approx(max(row["grid"].values()))
    assert row["grid"]["alpha=0,sharpen=0,beta=0"] == pytest.approx(out["valid"]["two_tower"]["recall@10"])
    assert row["point"]["beta"] > 0 and row["servable"]
    assert row["fit_on"] == {"valid": "train", "test": "train + valid"}
    assert row["fit"]["test"]["interactions"] == test_graph.nnz and row["fit"]["valid"]["interactions"] == train.nnz
    # test is ranked at the chosen point with the filter of train + valid: as a fit made here ranks it
    expected = fused.fit(test, {"two_tower": two_tower.fit(test, {}), "graph_filter": gf.fit(test, {})})
    ids = expected.topk(test, 10, [row["point"]], chunk_size=32)[point_key(row["point"])].numpy()
    assert np.array_equal(out["ids"]["test"][fused.name], ids)
    # no valid: a ranker with a grid needs its point, and says so
    with pytest.raises(ValueError, match="is chosen on valid, and there is no valid split"):
        evaluate_rankers([fused], valid=None, test=test, ks=[10], metric="recall@10", parts=[two_tower, gf])
    given = evaluate_rankers(
        [fused],
        valid=None,
        test=test,
        ks=[10],
        metric="recall@10",
        parts=[two_tower, gf],
        chosen={fused.name: row["point"]},
    )
    assert given["test"][fused.name]["recall@10"] == out["test"][fused.name]["recall@10"]
    assert given["rankers"][fused.name]["tuned_on"] == "given"


def test_ranker_settings_refusals_name_each_key():
    """Each ranker's package checks its settings (eval.settings.<name>): every bad key named at once."""
    base = tiny_config()
    check_rankers(base)
    bad = tiny_config(
        [
            "eval.settings.graph_filter.sharpen=[-2.5]",
            "eval.settings.graph_filter.rank=0",
            "eval.settings.graph_filter.iterations=0",
            "eval.settings.fusion.betas=[0.5,-1.0]",
            "eval.rankers=[two_tower,popularity,two_tower+graph_filter]",
            "eval.serve=popularity",
        ]
    )
    with pytest.raises(ValueError) as e:
        check_rankers(bad)
    said = str(e.value)
    assert "eval.settings.fusion.betas=[0.5, -1.0]" in said and "eval.settings.graph_filter.rank=0" in said
    assert "eval.settings.graph_filter.sharpen=[-2.5]: must be a non-empty list of values >= 0" in said
    assert "eval.settings.graph_filter.iterations=0" in said
    assert "eval.serve='popularity': must be one of eval.rankers' servable ones" in said
    with pytest.raises(ValueError, match="eval.rankers=.*must list two_tower"):
        check_rankers(tiny_config(["eval.rankers=[popularity]"]))
    # a typo in a ranker's settings, or a value of the wrong type: named with its place
    with pytest.raises(ValueError, match=r"eval.settings.graph_filter: Key 'rnak' not in 'GraphFilterSettings'"):
        check_rankers(tiny_config(["+eval.settings.graph_filter.rnak=3"]))
    with pytest.raises(
        ValueError, match=r"eval.settings.graph_filter: Value 'many' of type 'str' could not be converted"
    ):
        check_rankers(tiny_config(["eval.settings.graph_filter.rank=many"]))


def test_the_fit_memory_estimate_brackets_the_measured_peaks():
    # peak RSS growth of scripts/bench_graph_filter.py (2026-12-03, docs/performance.md): (items, interactions,
    # rank, GiB); the estimate may over-state (a refusal too early costs a lower rank) but not under-state by much
    measured = [
        (10_000, 195_704, 2048, 0.50),
        (100_000, 1_998_880, 2048, 3.47),
        (100_000, 1_998_880, 256, 1.00),
        (1_000_000, 20_149_193, 256, 9.57),
    ]
    for items, interactions, rank, gib in measured:
        estimate = fit_peak_bytes(items, interactions, rank=rank, low_rank=256, oversample=64) / 2**30
        assert 0.94 * gib <= estimate <= 1.45 * gib, (items, rank, estimate, gib)
    # a rank beyond the catalogue is cut to it, as the fit does
    assert fit_peak_bytes(100, 1000, rank=2048, low_rank=256, oversample=64) == fit_peak_bytes(
        100, 1000, rank=100, low_rank=100, oversample=0
    )
