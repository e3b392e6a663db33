"""GF-CF's graph filter, BSPM's sharpening and their fusion with the two-tower
(recsys/evaluation/graph_filter.py): the filters against dense numpy formulas, beta = 0 ranking as the
two-tower, the valid grid choosing the better ranking, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from recsys.config import Config, GraphFilterConfig, check_values, uses_graph_filter
from recsys.evaluation.graph_filter import (
    BLOCK_ARRAYS,
    GraphFilterFusion,
    block_rows,
    fit_graph_filter,
    fused_topk,
    graph_filter_topk,
    tune_fusion,
    tune_graph_filter,
)
from recsys.evaluation.interactions import UserItemCSR
from recsys.evaluation.metrics import compute_metrics
from recsys.evaluation.retrieval import exact_topk


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


def test_filters_match_gf_cf_formulas():
    graph = random_graph(40, 30, 6, seed=0)
    r = dense(graph)
    du, di = r.sum(1), r.sum(0)
    safe = lambda d: np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-12)), 0.0)  # noqa: E731
    norm = safe(du)[:, None] * r * safe(di)[None]
    _, _, vt = np.linalg.svd(norm)
    k = 5
    expected_low = r @ np.diag(safe(di)) @ vt[:k].T @ vt[:k] @ np.diag(np.sqrt(di))
    gf = fit_graph_filter(graph, rank=k)
    parts = gf.parts(sp.csr_matrix(r.astype(np.float32)), [0.0, 2.5])  # every user's row, plain and sharpened
    linear, low = parts[0.0]
    item_item = norm.T @ norm
    np.testing.assert_allclose(linear.numpy(), r @ item_item, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(low.numpy(), expected_low, rtol=1e-3, atol=1e-4)
    # BSPM's sharpening, one RK4 step of dU/dt = -U P over [0, 2.5]: U(0) (I - hP + (hP)^2/2 - (hP)^3/6 + (hP)^4/24)
    h = 2.5 * item_item
    step = np.eye(30) - h + h @ h / 2 - h @ h @ h / 6 + h @ h @ h @ h / 24
    np.testing.assert_allclose(parts[2.5][0].numpy(), r @ item_item @ step, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(parts[2.5][1].numpy(), expected_low @ step, rtol=1e-3, atol=1e-3)
    alone = graph_filter_topk(gf, graph, 3, alpha=0.3, sharpen=2.5)[1]
    expected = torch.from_numpy((r @ item_item + 0.3 * expected_low) @ step).float().topk(3, dim=1).indices
    assert torch.equal(alone, expected)
    assert fit_graph_filter(graph, rank=500).low_in.shape == (30, 29)  # capped below min(users, items)


def test_beta_zero_ranks_as_the_two_tower_and_the_grid_chooses_what_valid_prefers():
    """Items 0-19 come in pairs (2j, 2j+1) that users always hold together; valid holds one of a pair.
    Random embeddings cannot know that, the graph filter can: valid chooses beta > 0 and the fused
    ranking beats the two-tower's; with embeddings that know the answer, beta = 0 stays."""
    rng = np.random.default_rng(1)
    num_users, num_items = 60, 20
    train_u, train_i, valid_u, valid_i = [], [], [], []
    for u in range(num_users):
        pairs = rng.choice(10, 3, replace=False)
        for j, p in enumerate(pairs):
            train_u += [u, u] if j else [u]
            train_i += [2 * p, 2 * p + 1] if j else [2 * p]
        valid_u.append(u), valid_i.append(2 * pairs[0] + 1)
    graph = UserItemCSR.from_pairs(np.array(train_u), np.array(train_i), num_users=num_users, num_items=num_items)
    # the full graph (the held-out rows too) is where the pairs are learnt from
    full = UserItemCSR.from_pairs(
        np.array(train_u + valid_u), np.array(train_i + valid_i), num_users=num_users, num_items=num_items
    )
    relevant = UserItemCSR.from_pairs(np.array(valid_u), np.array(valid_i), num_users=num_users, num_items=num_items)
    gf = fit_graph_filter(full, rank=4)
    queries, items = torch.randn(num_users, 8, generator=torch.Generator().manual_seed(0)), torch.randn(num_items, 8)
    plain = exact_topk(queries, items, 5, exclude=graph)[1]
    assert torch.equal(fused_topk(queries, items, gf, graph, 5, alpha=0.3, beta=0.0, exclude=graph)[1], plain)

    common = dict(alphas=[0.0, 0.3], betas=[0.0, 10.0], rank=4, metric="recall@1", exclude=graph, chunk_size=16)
    choice, top = tune_fusion(queries, items, gf, graph, relevant, **common)
    assert choice.beta == 10.0 and choice.sharpen == 0.0
    assert set(choice.grid) == {"alpha=0,sharpen=0,beta=0", "alpha=0,sharpen=0,beta=10", "alpha=0.3,sharpen=0,beta=10"}
    fused = fused_topk(queries, items, gf, graph, 1, alpha=choice.alpha, beta=choice.beta, exclude=graph)[1]
    recall = lambda ids: compute_metrics(ids.numpy(), relevant, [1], num_items=num_items)["recall@1"]  # noqa: E731
    assert recall(fused) > 0.9 and recall(plain[:, :1]) < 0.3
    assert max(choice.grid.values()) == pytest.approx(recall(fused)) and torch.equal(top, fused)

    oracle_items = torch.eye(num_items)
    oracle_queries = torch.from_numpy(dense(relevant)).float() * 10  # each user's valid item scores 10, the rest 0
    assert tune_fusion(oracle_queries, oracle_items, gf, graph, relevant, **common)[0].beta == 0.0


def test_fusion_tunes_on_valid_then_ranks_test_and_refuses_test_first():
    graph = random_graph(30, 25, 5, seed=2)
    relevant = random_graph(30, 25, 1, seed=3)
    queries, items = torch.randn(30, 4), torch.randn(25, 4)
    options = dict(rank=3, max_pairs=10**9, metric="recall@5", ks=[5, 10], chunk_size=8)
    fusion = GraphFilterFusion(alphas=[0.0, 1.0], betas=[0.0, 1.0], sharpens=[0.0, 1.0], **options)
    with pytest.raises(ValueError, match="chosen on valid, and 'test' came first"):
        fusion.evaluate("test", queries, items, graph=graph, history=graph, relevant=relevant)
    valid = fusion.evaluate("valid", queries, items, graph=graph, history=graph, relevant=relevant)
    assert set(valid) >= {"recall@5", "recall@10", "ndcg@10"}
    info = fusion.describe()
    assert len(info["grid"]) == 1 + 2 * 2  # beta = 0 once, then alpha x sharpen
    assert valid["recall@5"] == pytest.approx(max(info["grid"].values()))
    assert info["grid"][f"alpha={info['alpha']:g},sharpen={info['sharpen']:g},beta={info['beta']:g}"] == max(
        info["grid"].values()
    )
    # a refit is given the selection's choice: no valid needed, and it ranks test as the choice does
    given = GraphFilterFusion(alphas=[info["alpha"]], betas=[info["beta"]], sharpens=[info["sharpen"]], **options)
    test = given.evaluate("test", queries, items, graph=graph, history=graph, relevant=relevant)
    assert given.describe()["tuned_on"] == "given (eval.graph_filter)"
    _, ids = fused_topk(queries, items, fit_graph_filter(graph, rank=3), graph, 10, alpha=info["alpha"],
                        beta=info["beta"], sharpen=info["sharpen"], exclude=graph)  # fmt: skip
    assert test == compute_metrics(ids.numpy(), relevant, [5, 10], num_items=25)

    # the filter alone over (alpha, sharpen) in one pass: each point as graph_filter_topk ranks it
    gf = fit_graph_filter(graph, rank=3)
    alone = tune_graph_filter(
        gf, graph, relevant, alphas=[0.0, 1.0], sharpens=[0.0, 1.0], metric="recall@5", exclude=graph
    )
    for (alpha, sharpen), value in alone.items():
        ids = graph_filter_topk(gf, graph, 5, alpha=alpha, sharpen=sharpen, exclude=graph)[1]
        assert value == compute_metrics(ids.numpy(), relevant, [5], num_items=25)["recall@5"]
    assert len(alone) == 4

    other = fit_graph_filter(random_graph(30, 24, 5, seed=4), rank=3)  # a filter of another catalogue
    with pytest.raises(ValueError, match="graph filter 24 items"):
        fused_topk(queries, items, other, graph, 5, alpha=0.0, beta=1.0)

    small = GraphFilterFusion(alphas=[0.0], betas=[1.0], **{**options, "max_pairs": 10})
    assert small.evaluate("valid", queries, items, graph=graph, history=graph, relevant=relevant) is None
    assert "max_pairs=10" in small.describe()["skipped"]


def test_memory_bound_shrinks_the_blocks_and_leaves_every_ranking_as_it_was():
    assert block_rows(4096, 40_981, 8.0) == 4096  # Gowalla's catalogue keeps eval.chunk_size at the default
    assert block_rows(4096, 40_981, 4.0) == 2183  # 12 x 2183 x 40,981 x 4 B <= 4 GiB
    assert block_rows(1024, 40_981, 4.0) == 1024  # eval.chunk_size stays the cap
    assert block_rows(4096, 10**9, 4.0) == 1  # never 0, whatever the catalogue
    with pytest.raises(ValueError, match="memory_gb must be > 0, got 0"):
        block_rows(4096, 100, 0)

    graph, relevant = random_graph(30, 25, 5, seed=5), random_graph(30, 25, 1, seed=6)
    queries, items = torch.randn(30, 4), torch.randn(25, 4)
    gf = fit_graph_filter(graph, rank=3)
    one_row = BLOCK_ARRAYS * 4 * 25 / 2**30  # room for blocks of one user
    assert block_rows(16, 25, one_row) == 1
    grid = dict(alphas=[0.0, 0.3], sharpens=[0.0, 2.5], metric="recall@5", exclude=graph, chunk_size=16)
    wide, narrow = (
        tune_fusion(queries, items, gf, graph, relevant, betas=[0.0, 0.2], rank=3, top=10, memory_gb=m, **grid)
        for m in (8.0, one_row)
    )
    assert wide[0].grid == narrow[0].grid and torch.equal(wide[1], narrow[1])
    assert tune_graph_filter(gf, graph, relevant, memory_gb=one_row, **grid) == tune_graph_filter(
        gf, graph, relevant, **grid
    )
    point = dict(alpha=0.3, sharpen=2.5, exclude=graph, chunk_size=16)
    for m in (8.0, one_row):  # each block a different size, the same top-k as one block of all users
        assert torch.equal(
            fused_topk(queries, items, gf, graph, 10, beta=0.2, memory_gb=m, **point)[1],
            fused_topk(queries, items, gf, graph, 10, beta=0.2, **{**point, "chunk_size": 30})[1],
        )
        assert torch.equal(
            graph_filter_topk(gf, graph, 10, memory_gb=m, **point)[1],
            graph_filter_topk(gf, graph, 10, **{**point, "chunk_size": 30})[1],
        )


def test_graph_filter_config_defaults_and_refusals():
    cfg = Config()
    assert uses_graph_filter(cfg) == (cfg.data.item_neighbors > 0)
    on = Config(eval=type(cfg.eval)(graph_filter=GraphFilterConfig(enabled=True)))
    assert uses_graph_filter(on)
    bad = Config(
        eval=type(cfg.eval)(graph_filter=GraphFilterConfig(betas=[0.5, -1.0], sharpen=[-2.5], rank=0, memory_gb=0.0))
    )
    with pytest.raises(ValueError) as e:
        check_values(bad)
    assert "eval.graph_filter.betas=[0.5, -1.0]" in str(e.value) and "eval.graph_filter.rank=0" in str(e.value)
    assert "eval.graph_filter.sharpen=[-2.5]: must be a non-empty list of values >= 0" in str(e.value)
    assert "eval.graph_filter.memory_gb=0.0: must be > 0" in str(e.value)
