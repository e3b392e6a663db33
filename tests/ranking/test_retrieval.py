"""exact_topk / popularity_topk against a brute-force full-matrix sort with the tie rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk, popularity_topk


def _reference_topk(scores: np.ndarray, k: int, exclude: UserItemCSR | None):
    """Full [U, I] scores -> (scores, ids) [U, k] sorted by (score desc, id asc), -1 / -inf padded."""
    num_users, num_items = scores.shape
    out_scores = np.full((num_users, k), -np.inf, dtype=np.float32)
    out_ids = np.full((num_users, k), -1, dtype=np.int64)
    for u in range(num_users):
        excluded = set() if exclude is None else set(exclude.row(u).tolist())
        kept = [i for i in range(num_items) if i not in excluded]
        ranked = sorted(kept, key=lambda i: (-scores[u, i], i))[:k]
        out_ids[u, : len(ranked)] = ranked
        out_scores[u, : len(ranked)] = scores[u, ranked]
    return out_scores, out_ids


def _random_exclude(rng, num_users, num_items, max_per_user):
    users, items = [], []
    for u in range(num_users):
        n = rng.integers(0, max_per_user + 1)
        users += [u] * n
        items += rng.choice(num_items, size=n, replace=False).tolist()
    return UserItemCSR.from_pairs(np.array(users), np.array(items), num_users=num_users, num_items=num_items)


def _tied_embeddings(rng, num_users, num_items, dim):
    """Integer-valued vectors (exact float32 dot products, many equal scores) plus duplicated items."""
    queries = torch.from_numpy(rng.integers(-2, 3, size=(num_users, dim)).astype(np.float32))
    items = torch.from_numpy(rng.integers(-2, 3, size=(num_items, dim)).astype(np.float32))
    dup = rng.choice(num_items, size=num_items // 3, replace=False)
    items[dup] = items[rng.choice(num_items, size=dup.shape[0])]
    return queries, items


def _assert_matches_reference(queries, items, k, exclude, chunk_size):
    scores, ids = exact_topk(queries, items, k, exclude=exclude, chunk_size=chunk_size)
    assert scores.dtype == torch.float32 and ids.dtype == torch.int64
    assert scores.shape == ids.shape == (queries.shape[0], k)
    ref_scores, ref_ids = _reference_topk((queries @ items.T).numpy(), k, exclude)
    np.testing.assert_array_equal(ids.numpy(), ref_ids)
    np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_exact_topk_with_ties_matches_reference(seed, chunk_size):
    rng = np.random.default_rng(seed)
    queries, items = _tied_embeddings(rng, num_users=37, num_items=60, dim=3)
    exclude = _random_exclude(rng, 37, 60, max_per_user=20)
    _assert_matches_reference(queries, items, 10, exclude, chunk_size)


@pytest.mark.parametrize("seed", range(3))
def test_exact_topk_float_matches_reference(seed):
    rng = np.random.default_rng(seed)
    queries = torch.from_numpy(rng.standard_normal((50, 16)).astype(np.float32))
    items = torch.from_numpy(rng.standard_normal((200, 16)).astype(np.float32))
    items[100:150] = items[:50]  # exact duplicates: equal scores, lower id must come first
    exclude = _random_exclude(rng, 50, 200, max_per_user=30)
    _assert_matches_reference(queries, items, 25, exclude, chunk_size=16)
    _assert_matches_reference(queries, items, 25, None, chunk_size=16)


def test_all_scores_tied_returns_lowest_ids():
    # every item scores the same, so the answer is purely the tie rule: the k lowest non-excluded ids
    queries = torch.ones(3, 2)
    items = torch.ones(500, 2)
    exclude = UserItemCSR.from_pairs([1, 1, 2], [0, 3, 499], num_users=3, num_items=500)
    _, ids = exact_topk(queries, items, 5, exclude=exclude)
    np.testing.assert_array_equal(ids.numpy(), [[0, 1, 2, 3, 4], [1, 2, 4, 5, 6], [0, 1, 2, 3, 4]])


@pytest.mark.parametrize("seed", range(3))
def test_chunk_size_does_not_change_output(seed):
    rng = np.random.default_rng(seed)
    queries, items = _tied_embeddings(rng, num_users=29, num_items=80, dim=4)
    exclude = _random_exclude(rng, 29, 80, max_per_user=40)
    outputs = [exact_topk(queries, items, 12, exclude=exclude, chunk_size=c) for c in (1, 7, 29, 4096)]
    for scores, ids in outputs[1:]:
        assert torch.equal(scores, outputs[0][0])
        assert torch.equal(ids, outputs[0][1])


@pytest.mark.parametrize("seed", range(3))
def test_excluded_items_never_returned(seed):
    rng = np.random.default_rng(seed)
    queries = torch.randn(40, 8, generator=torch.Generator().manual_seed(seed))
    items = torch.randn(50, 8, generator=torch.Generator().manual_seed(seed + 100))
    exclude = _random_exclude(rng, 40, 50, max_per_user=45)
    _, ids = exact_topk(queries, items, 10, exclude=exclude, chunk_size=9)
    for u in range(40):
        returned = set(ids[u].tolist()) - {-1}
        assert not returned & set(exclude.row(u).tolist())
        assert len(returned) == min(10, 50 - exclude.lengths()[u])


def test_padding_when_too_few_items_remain():
    queries = torch.tensor([[1.0], [1.0], [-1.0]])
    items = torch.tensor([[3.0], [1.0], [2.0], [0.0]])  # scores for query 0: [3, 1, 2, 0]
    # user 0 keeps {1, 3}; user 1 keeps nothing; user 2 keeps everything (scores [-3, -1, -2, 0])
    exclude = UserItemCSR.from_pairs([0, 0, 1, 1, 1, 1], [0, 2, 0, 1, 2, 3], num_users=3, num_items=4)
    scores, ids = exact_topk(queries, items, 6, exclude=exclude, chunk_size=2)
    inf = float("inf")
    np.testing.assert_array_equal(ids.numpy(), [[1, 3, -1, -1, -1, -1], [-1] * 6, [3, 1, 2, 0, -1, -1]])
    np.testing.assert_array_equal(
        scores.numpy(), [[1, 0, -inf, -inf, -inf, -inf], [-inf] * 6, [0, -1, -2, -3, -inf, -inf]]
    )


def test_padding_matches_reference_with_heavy_exclusion():
    rng = np.random.default_rng(7)
    queries, items = _tied_embeddings(rng, num_users=20, num_items=15, dim=2)
    exclude = _random_exclude(rng, 20, 15, max_per_user=15)
    assert (exclude.lengths() > 15 - 8).any()  # some users have fewer than k items left
    _assert_matches_reference(queries, items, 8, exclude, chunk_size=6)
    _assert_matches_reference(queries, items, 20, exclude, chunk_size=6)  # k > num_items


def test_exclude_shape_is_checked():
    exclude = UserItemCSR.from_pairs([0], [0], num_users=2, num_items=5)
    with pytest.raises(ValueError):
        exact_topk(torch.ones(3, 2), torch.ones(5, 2), 2, exclude=exclude)


@pytest.mark.parametrize("seed", range(3))
def test_popularity_topk_matches_sorted_counts(seed):
    rng = np.random.default_rng(seed)
    num_users, num_items, k = 25, 40, 15
    counts = rng.integers(0, 6, size=num_items)  # many equal counts
    exclude = _random_exclude(rng, num_users, num_items, max_per_user=30)
    scores, ids = popularity_topk(torch.from_numpy(counts), num_users, k, exclude=exclude, chunk_size=4)
    for u in range(num_users):
        excluded = set(exclude.row(u).tolist())
        # an item never trained on (count 0) is never ranked: only id order would place it
        ranked = (i for i in range(num_items) if i not in excluded and counts[i] > 0)
        expected = sorted(ranked, key=lambda i: (-counts[i], i))[:k]
        expected += [-1] * (k - len(expected))
        assert ids[u].tolist() == expected
        kept = ids[u] >= 0
        np.testing.assert_array_equal(scores[u][kept].numpy(), counts[ids[u][kept].numpy()])


def test_faiss_selection_and_torch_topk_give_the_same_result(monkeypatch):
    """The CPU path selects with FAISS heaps; without faiss it falls back to torch.topk: same output, ties included."""
    import builtins

    rng = np.random.default_rng(5)
    queries, items = _tied_embeddings(rng, 40, 300, 6)
    exclude = _random_exclude(rng, 40, 300, 290)  # some rows keep fewer than k items: -1 / -inf padding
    with_faiss = exact_topk(queries, items, 20, exclude=exclude, chunk_size=16)
    real_import = builtins.__import__

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("no faiss here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    without = exact_topk(queries, items, 20, exclude=exclude, chunk_size=16)
    assert torch.equal(with_faiss[1], without[1]) and torch.equal(with_faiss[0], without[0])
    assert (with_faiss[1] == -1).any()  # the padding case was exercised


def _device_path(queries, items, k, exclude, chunk_size, by_groups=True):
    """chunked_topk's device path (what runs on CUDA), run on the CPU."""
    from recsys.ranking.device_topk import device_chunked_topk

    def score_chunk(start, stop, out):
        return torch.mm(queries[start:stop], items.t(), out=out)

    return device_chunked_topk(
        score_chunk, queries.shape[0], items.shape[0], k, exclude=exclude, chunk_size=chunk_size, device="cpu",
        by_groups=by_groups,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_items", [60, 1500])  # 1500: the candidates come by groups (47 of 32, the last short)
@pytest.mark.parametrize("by_groups", [True, False])
def test_device_path_gives_the_host_paths_ids(seed, num_items, by_groups):
    """The device path (mask from the CSR's ids on the device, candidates by groups, tie fix-ups decided a chunk
    late) against the host path: the same ids and scores to the last bit, ties, heavy exclusion and padding included."""
    rng = np.random.default_rng(seed)
    queries, items = _tied_embeddings(rng, num_users=45, num_items=num_items, dim=3)
    exclude = _random_exclude(rng, 45, num_items, max_per_user=num_items - 5)
    kept_4 = UserItemCSR.from_pairs(np.zeros(num_items - 4), np.arange(4, num_items), num_users=45, num_items=num_items)
    exclude = exclude.union(kept_4)  # user 0 keeps 4 items: fewer than k
    for chunk_size in (1, 8, 1000):
        host = exact_topk(queries, items, 10, exclude=exclude, chunk_size=chunk_size)
        device = _device_path(queries, items, 10, exclude, chunk_size, by_groups)
        assert torch.equal(device[1], host[1]) and torch.equal(device[0], host[0])
    assert (host[1] == -1).any()  # the padding case was exercised
    # no exclusion, float scores
    queries, items = torch.randn(20, 8, dtype=torch.float32), torch.randn(num_items, 8, dtype=torch.float32)
    host, device = exact_topk(queries, items, 7, chunk_size=6), _device_path(queries, items, 7, None, 6, by_groups)
    assert torch.equal(device[1], host[1]) and torch.equal(device[0], host[0])


def test_candidates_by_groups_hold_the_rows_best_values():
    """top_candidates by groups: the n best values of every row exactly (the ids may differ among equal values),
    whether the best scores crowd into a few groups or spread, with -inf (masked) entries and a short last group."""
    from recsys.ranking.device_topk import top_candidates

    rng = np.random.default_rng(0)
    scores = torch.from_numpy(rng.integers(0, 50, size=(6, 4000)).astype(np.float32))
    scores[0, :100] = 1000.0  # the 100 best of row 0 crowd into 4 groups
    scores[1, ::40] = 1000.0  # row 1's spread over 100 groups
    scores[2, 3000:] = float("-inf")  # a masked tail
    scores[3, :] = float("-inf")
    scores = torch.cat([scores, scores[:, :30]], dim=1)  # 4030 items: 125 groups of 32, then one of 30
    scores[3, 4029] = 5.0  # row 3's one finite score, in that short last group
    vals, ids = top_candidates(scores, 11)
    expected = torch.topk(scores, 11, dim=1).values
    assert torch.equal(vals, expected)
    assert torch.equal(torch.gather(scores, 1, ids)[~torch.isneginf(vals)], vals[~torch.isneginf(vals)])
    assert (ids < scores.shape[1]).all() and (ids >= 0).all()


@pytest.mark.parametrize("block", [7, 1 << 24])
def test_popularity_topk_is_exact_topk_over_the_counts(monkeypatch, block):
    """Ranked over the head of one global order (blocks of any size): the ids and scores of ranking every item."""
    import recsys.ranking.retrieval as retrieval

    monkeypatch.setattr(retrieval, "POPULARITY_BLOCK", block)
    rng = np.random.default_rng(11)
    num_users, num_items = 30, 60
    counts = torch.from_numpy(rng.integers(0, 4, size=num_items))
    exclude = _random_exclude(rng, num_users, num_items, max_per_user=58)
    for k in (1, 5, 70):
        got = popularity_topk(counts, num_users, k, exclude=exclude, chunk_size=8)
        want = exact_topk(
            torch.ones(num_users, 1), counts.float()[:, None], k, exclude=exclude, chunk_size=8, unranked=counts == 0
        )
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    top = sorted(range(num_items), key=lambda i: (-int(counts[i]), i))[:3]  # no exclusions: the same top 3 for all
    assert popularity_topk(counts, num_users, 3)[1].tolist() == [top] * num_users
