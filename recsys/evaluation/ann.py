"""Approximate top-k with FAISS (flat inner product, IVF-flat, HNSW), judged against the exact top-k.

Same semantics as ``exact_topk``: inner-product scores, per-user excluded items never returned,
results ordered by (score desc, id asc), -1 / -inf padding. FAISS cannot mask per query, so each
batch of queries searches ``k + (most items excluded for a query of the batch)`` neighbours and
drops the excluded ones; at least k non-excluded items remain among them whenever the index
returns its true nearest neighbours (exactly so for the flat index, whose recall vs exact is 1).

Reported (``compare_ann``): recall of the ANN top-k against the exact top-k,
``mean_u |ann_k(u) ∩ exact_k(u)| / |exact_k(u)|``, and query latency beside the exact search:
batched throughput (users/s, ms/query = batch seconds / users, exclusion filtering included) and
single-query latency (median ms over a sample of queries searched one at a time).

Needs ``faiss`` (``pip install faiss-cpu``, a dependency of the package).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import hit_matrix
from recsys.ranking.retrieval import exact_topk
from recsys.utils.choices import ANN_KINDS  # the config names them too


def require_faiss():
    """The ``faiss`` module, or an ImportError that says how to install it."""
    try:
        import faiss  # noqa: PLC0415 (optional heavy import, only where ANN is used)
    except ImportError as e:
        raise ImportError(
            "ANN evaluation needs FAISS, which is not importable in this environment "
            f"({e}). Install it with `pip install faiss-cpu` (or a faiss-gpu build), "
            "or turn the ANN comparison off."
        ) from e
    return faiss


@dataclass(frozen=True)
class AnnParams:
    """Index settings. ``nlist`` None means ``clip(4 * sqrt(I), 1, I // 39)`` (FAISS wants >= 39
    training points per list); ``nprobe`` lists are scanned per query (capped at nlist);
    HNSW: ``hnsw_m`` links per node, ``ef_construction`` / ``ef_search`` beam widths (search uses
    at least the number of neighbours asked for). ``nprobe_sweep``: the IVF index is also searched
    at these nprobe values (capped at nlist; nlist itself = exhaustive) to show recall against speed."""

    nlist: int | None = None
    nprobe: int = 16
    nprobe_sweep: tuple[int, ...] = (1, 4, 16, 64)
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128

    def num_lists(self, num_items: int) -> int:
        if self.nlist is not None:
            return max(1, min(self.nlist, num_items))
        return int(max(1, min(round(4 * np.sqrt(num_items)), num_items // 39)))


def _as_f32(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def build_index(
    item_emb: np.ndarray | torch.Tensor, kind: str, params: AnnParams = AnnParams(), ids: np.ndarray | None = None
):
    """A FAISS inner-product index over ``item_emb`` [I, D]; FAISS id = row = item id.

    kind: "flat" (exact, brute force), "ivf_flat" (k-means coarse quantizer, ``nlist`` lists, flat
    vectors, ``nprobe`` scanned), "hnsw" (graph, ``IndexHNSWFlat``).
    ``ids``: int64, the only rows indexed (the items a served ranker ranks), each under its item id; None: every row.
    """
    faiss = require_faiss()
    items = _as_f32(item_emb)
    if ids is not None:
        items = np.ascontiguousarray(items[ids])
    num_items, dim = items.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf_flat":
        nlist = params.num_lists(num_items)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(items)
        index.nprobe = min(params.nprobe, nlist)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.ef_construction
        index.hnsw.efSearch = params.ef_search
    else:
        raise ValueError(f"unknown ANN index kind {kind!r}; choose from {ANN_KINDS}")
    if ids is None:
        index.add(items)
        return index
    if kind != "ivf_flat":  # IVF keeps ids itself; the others through an id map
        index = faiss.IndexIDMap2(index)
    index.add_with_ids(items, np.ascontiguousarray(ids, dtype=np.int64))
    return index


def _hnsw(index):
    """The HNSW graph of ``index`` (also behind an id map), or None."""
    if hasattr(index, "hnsw"):
        return index.hnsw
    inner = getattr(index, "index", None)
    if inner is None:
        return None
    return getattr(require_faiss().downcast_index(inner), "hnsw", None)


def ann_topk(
    index,
    queries: np.ndarray | torch.Tensor,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    batch_size: int = 4096,
    ef_search: int = 128,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k per query from a FAISS index, excluded items removed (see the module docstring).

    Args:
        index: from ``build_index`` (ids = item ids).
        queries: [U, D] query embeddings.
        k: >= 1.
        exclude: optional [U rows, I items] CSR of items never returned.
        batch_size: queries per ``index.search`` call (the over-fetch is per batch).
        ef_search: HNSW beam width floor (raised to the number of neighbours fetched).

    Returns:
        scores float32 [U, k], ids int64 [U, k], ordered by (score desc, id asc); -inf / -1 padding.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    queries = _as_f32(queries)
    num_queries, num_items = queries.shape[0], index.ntotal  # items indexed: all, or those ``build_index``'s ids name
    if exclude is not None and (exclude.num_users != num_queries or exclude.num_items < num_items):
        raise ValueError(
            f"exclude is ({exclude.num_users}, {exclude.num_items}), queries/items are ({num_queries}, {num_items})"
        )
    hnsw = _hnsw(index)
    out_scores = np.full((num_queries, k), -np.inf, dtype=np.float32)
    out_ids = np.full((num_queries, k), -1, dtype=np.int64)
    lengths = exclude.lengths() if exclude is not None else np.zeros(num_queries, dtype=np.int64)
    for start in range(0, num_queries, batch_size):
        stop = min(start + batch_size, num_queries)
        fetch = int(min(num_items, k + (lengths[start:stop].max() if stop > start else 0)))
        if fetch == 0:
            continue
        if hnsw is not None:
            hnsw.efSearch = max(ef_search, fetch)
        scores, ids = index.search(queries[start:stop], fetch)  # [C, fetch]; missing: id -1
        ids = ids.astype(np.int64, copy=False)
        drop = ids < 0
        if exclude is not None:
            drop |= hit_matrix(ids, exclude.select_rows(np.arange(start, stop)))
        scores = np.where(drop, -np.inf, scores).astype(np.float32)
        ids = np.where(drop, -1, ids)
        order = np.lexsort((np.where(drop, np.iinfo(np.int64).max, ids), -scores), axis=1)[:, :k]
        width = order.shape[1]
        out_scores[start:stop, :width] = np.take_along_axis(scores, order, axis=1)
        out_ids[start:stop, :width] = np.take_along_axis(ids, order, axis=1)
    return out_scores, out_ids


def recall_vs_exact(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """mean_u |approx(u) ∩ exact(u)| / |exact(u)| over users with >= 1 exact id; -1 slots ignored.

    Both int64 [U, k]; NaN if no user has an exact id.
    """
    approx_ids, exact_ids = np.asarray(approx_ids, dtype=np.int64), np.asarray(exact_ids, dtype=np.int64)
    if approx_ids.shape[0] != exact_ids.shape[0]:
        raise ValueError(f"row counts differ: {approx_ids.shape[0]} vs {exact_ids.shape[0]}")
    valid = exact_ids >= 0
    num_items = int(max(exact_ids.max(initial=-1), approx_ids.max(initial=-1))) + 1
    users = np.repeat(np.arange(exact_ids.shape[0]), valid.sum(axis=1))
    truth = UserItemCSR.from_pairs(users, exact_ids[valid], num_users=exact_ids.shape[0], num_items=max(num_items, 1))
    found = hit_matrix(approx_ids, truth).sum(axis=1)
    has = truth.lengths() > 0
    return float((found[has] / truth.lengths()[has]).mean()) if has.any() else float("nan")


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _single_query_ms(search_one, sample: np.ndarray) -> float:
    times = []
    for u in sample:
        _, seconds = _timed(lambda: search_one(int(u)))
        times.append(seconds * 1e3)
    return float(np.median(times)) if times else float("nan")


def compare_ann(
    item_emb: np.ndarray | torch.Tensor,
    user_emb: np.ndarray | torch.Tensor,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    kinds: Sequence[str] = ANN_KINDS,
    params: AnnParams = AnnParams(),
    chunk_size: int = 4096,
    latency_sample: int = 100,
    seed: int = 0,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Exact top-k vs each FAISS index: recall against exact, build time, query latency.

    Args:
        item_emb: [I, D]; user_emb: [U, D]; k: cut-off; exclude: [U rows, I] CSR of masked items.
        kinds: subset of ``ANN_KINDS``.
        latency_sample: queries timed one at a time (a seeded sample) for single-query latency.

    Returns:
        (summary, ids): summary is ``{"k", "num_queries", "num_items", "threads", "exact": {timing},
        "indexes": {kind: {"recall_vs_exact", "build_s", timing, "params"}}}`` with timing =
        ``{"search_s", "ms_per_query", "users_per_s", "single_query_ms"}``; ids maps "exact" and
        each kind to its int64 [U, k] top-k ids.
    """
    faiss = require_faiss()
    items, users = _as_f32(item_emb), _as_f32(user_emb)
    num_queries = users.shape[0]
    sample = np.sort(
        np.random.default_rng(seed).choice(num_queries, size=min(latency_sample, num_queries), replace=False)
    )
    items_t, users_t = torch.from_numpy(items), torch.from_numpy(users)
    timing = partial(_timing, num_queries=num_queries)

    def exact_one(u: int):
        return exact_topk(users_t[u : u + 1], items_t, k, exclude=None if exclude is None else exclude.select_rows([u]))

    (_, exact_ids_t), exact_s = _timed(lambda: exact_topk(users_t, items_t, k, exclude=exclude, chunk_size=chunk_size))
    exact_ids = exact_ids_t.numpy()
    summary = {
        "k": k,
        "num_queries": num_queries,
        "num_items": int(items.shape[0]),
        "threads": {"torch": torch.get_num_threads(), "faiss": faiss.omp_get_max_threads()},
        "exact": timing(exact_s, _single_query_ms(exact_one, sample)),
        "indexes": {},
    }
    all_ids = {"exact": exact_ids}
    for kind in kinds:
        summary["indexes"][kind], all_ids[kind] = _compare_index(
            kind, items, users, k, exclude, params, chunk_size, sample, exact_ids
        )
    return summary, all_ids


def _timing(seconds: float, single_ms: float, *, num_queries: int) -> dict:
    """A search's timing over ``num_queries`` queries, and one query's alone (``single_ms``)."""
    return {
        "search_s": seconds,
        "ms_per_query": seconds * 1e3 / max(num_queries, 1),
        "users_per_s": num_queries / seconds if seconds > 0 else float("inf"),
        "single_query_ms": single_ms,
    }


def _compare_index(
    kind: str,
    items: np.ndarray,
    users: np.ndarray,
    k: int,
    exclude: UserItemCSR | None,
    params: AnnParams,
    chunk_size: int,
    sample: np.ndarray,
    exact_ids: np.ndarray,
) -> tuple[dict, np.ndarray]:
    """One FAISS index against the exact top-k: (its summary entry, its [U, k] top-k ids)."""
    timing = partial(_timing, num_queries=users.shape[0])
    index, build_s = _timed(lambda: build_index(items, kind, params))
    (_, ids), search_s = _timed(
        lambda: ann_topk(index, users, k, exclude=exclude, batch_size=chunk_size, ef_search=params.ef_search)
    )

    def ann_one(u: int):
        return ann_topk(
            index,
            users[u : u + 1],
            k,
            exclude=None if exclude is None else exclude.select_rows([u]),
            ef_search=params.ef_search,
        )

    entry = {"recall_vs_exact": recall_vs_exact(ids, exact_ids), "build_s": build_s}
    entry.update(timing(search_s, _single_query_ms(ann_one, sample)))
    entry["params"] = _index_params(index, kind, params, items.shape[0])
    if kind == "ivf_flat" and params.nprobe_sweep:
        entry["nprobe_sweep"] = _nprobe_sweep(index, users, k, exclude, exact_ids, params, chunk_size, timing)
    return entry, ids


def _nprobe_sweep(index, users, k, exclude, exact_ids, params: AnnParams, chunk_size: int, timing) -> list[dict]:
    """Recall vs exact and batched speed of one IVF index at each nprobe of the sweep (index restored after)."""
    configured, out = index.nprobe, []
    for nprobe in sorted({min(max(1, int(p)), index.nlist) for p in params.nprobe_sweep}):
        index.nprobe = nprobe
        (_, ids), seconds = _timed(lambda: ann_topk(index, users, k, exclude=exclude, batch_size=chunk_size))
        speed = timing(seconds, float("nan"))
        out.append(
            {
                "nprobe": nprobe,
                "recall_vs_exact": recall_vs_exact(ids, exact_ids),
                "ms_per_query": speed["ms_per_query"],
                "users_per_s": speed["users_per_s"],
            }
        )
    index.nprobe = configured
    return out


def _index_params(index, kind: str, params: AnnParams, num_items: int) -> dict:
    if kind == "ivf_flat":
        return {"nlist": params.num_lists(num_items), "nprobe": int(index.nprobe)}
    if kind == "hnsw":
        return {"M": params.hnsw_m, "ef_construction": params.ef_construction, "ef_search": params.ef_search}
    return {}
