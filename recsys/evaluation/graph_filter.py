"""GF-CF's graph filter (Shen et al., CIKM 2021) and its fusion with the two-tower's ranking scores.

Built from binary interactions R [users, items] (the evaluated split's preceding splits, every user),
normalised as LightGCN does, R~ = D_u^-1/2 R D_i^-1/2, the filter scores user u's items r_u as

    gf(u) = r_u R~'R~  +  alpha * r_u D_i^-1/2 V V' D_i^1/2

a linear filter (item-item co-occurrence, each shared user weighted 1/d_u, each pair 1/sqrt(d_i d_j))
plus an ideal low-pass filter (V: the top ``rank`` right singular vectors of R~). The fused score is

    s(u) = cos(u) / std(cos(u)) + beta * gf(u) / std(gf(u))

each term divided by its spread over the user's scores of all items, so beta weighs like against
like; beta = 0 ranks as the two-tower alone. alpha and beta are chosen on valid from a grid
(``tune_fusion``). On Gowalla the two scores are complementary: the two-tower alone 0.1756 test
Recall@20, GF-CF alone 0.1849, fused higher (docs/quality.md, section 15).

Cost: the item-item matrix has one entry per co-occurring item pair (Gowalla: 36M for 41k items),
so it is built on one host, with ``max_pairs`` bounding sum_u d_u^2 before anything is allocated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import svds

from recsys.evaluation.interactions import UserItemCSR
from recsys.evaluation.metrics import compute_metrics
from recsys.evaluation.retrieval import chunked_topk, topk_from_scores

log = logging.getLogger("recsys.evaluation.graph_filter")

FUSED_MODEL = "two_tower+graph_filter"  # the fused ranking's name in results.json and the printed table


@dataclass
class GraphFilter:
    """The two filters of one interaction graph, ready to score rows of users' items."""

    item_item: sp.csr_matrix  # float32 [I, I]: R~'R~
    low_in: torch.Tensor  # float32 [I, k]: D_i^-1/2 V
    low_out: torch.Tensor  # float32 [k, I]: V' D_i^1/2

    @property
    def num_items(self) -> int:
        return int(self.item_item.shape[0])

    def parts(self, rows: sp.csr_matrix) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear, low-pass) float32 [C, I] of the binary item rows ``rows`` [C, I]."""
        linear = torch.from_numpy((rows @ self.item_item).toarray().astype(np.float32, copy=False))
        low = torch.from_numpy(rows.toarray().astype(np.float32, copy=False)) @ self.low_in @ self.low_out
        return linear, low


def too_many_pairs(graph: UserItemCSR, max_pairs: int) -> str:
    """Why the filter of ``graph`` is not built ("" when it is): sum_u d_u^2 bounds the item-item
    matrix's entries (and its construction's work), checked before anything is allocated."""
    lengths = graph.lengths().astype(np.int64)
    pairs = int((lengths * lengths).sum())
    if pairs <= max_pairs:
        return ""
    return f"sum over users of (items per user)^2 = {pairs:,} > max_pairs={max_pairs:,}: the item-item matrix would not fit one host"


def fit_graph_filter(graph: UserItemCSR, rank: int) -> GraphFilter:
    """GF-CF's filters of ``graph`` (binary, every user's items); ``rank`` is capped below min(U, I)."""
    num_users, num_items = graph.num_users, graph.num_items
    r = _rows(graph, 0, num_users).astype(np.float64)
    user_deg = np.asarray(r.sum(axis=1)).ravel()
    item_deg = np.asarray(r.sum(axis=0)).ravel()
    inv_sqrt = lambda d: np.where(d > 0, 1.0 / np.sqrt(np.maximum(d, 1e-12)), 0.0)  # noqa: E731
    norm = (sp.diags(inv_sqrt(user_deg)) @ r @ sp.diags(inv_sqrt(item_deg))).tocsr()
    item_item = (norm.T @ norm).tocsr().astype(np.float32)
    k = max(1, min(rank, min(num_users, num_items) - 1))
    # a fixed start vector: ARPACK's default is random, and the filter must be the same on every run
    v0 = np.ones(min(num_users, num_items), dtype=np.float64) / np.sqrt(min(num_users, num_items))
    _, _, vt = svds(norm, k=k, v0=v0)
    vt = torch.from_numpy(np.ascontiguousarray(vt, dtype=np.float32))  # [k, I]; V V' ignores signs and order
    low_in = (vt * torch.from_numpy(inv_sqrt(item_deg).astype(np.float32))[None]).t().contiguous()
    low_out = vt * torch.from_numpy(np.sqrt(item_deg).astype(np.float32))[None]
    return GraphFilter(item_item=item_item, low_in=low_in, low_out=low_out)


def _rows(history: UserItemCSR, start: int, stop: int) -> sp.csr_matrix:
    lo, hi = history.indptr[start], history.indptr[stop]
    return sp.csr_matrix(
        (np.ones(hi - lo, dtype=np.float32), history.indices[lo:hi], history.indptr[start : stop + 1] - lo),
        shape=(stop - start, history.num_items),
    )


def _spread_normalised(scores: torch.Tensor) -> torch.Tensor:
    return scores / scores.std(dim=1, keepdim=True).clamp_min(1e-12)  # a row of one value (no history) gives 0s


def fused_scores(cos: torch.Tensor, linear: torch.Tensor, low: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """The fused score [C, I] of the two-tower's scores ``cos`` and the filter's parts (module docstring)."""
    out = _spread_normalised(cos)
    if beta:  # torch.add as tune_fusion does: the chosen point ranks bit for bit as it was scored
        out = torch.add(out, _spread_normalised(linear + alpha * low), alpha=beta)
    return out


@dataclass
class FusionChoice:
    """alpha and beta of the fused score, and the valid metric of every grid point that chose them."""

    alpha: float
    beta: float
    rank: int
    grid: dict[str, float] = field(default_factory=dict)  # "alpha=..,beta=.." -> valid metric
    tuned_on: str = ""

    def describe(self) -> dict:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "rank": self.rank,
            "grid": self.grid,
            "tuned_on": self.tuned_on,
            "score": "cos/std(cos) + beta * gf/std(gf), gf = r R~'R~ + alpha * r D^-1/2 V V' D^1/2 (GF-CF)",
        }


def _check_inputs(queries: torch.Tensor, items: torch.Tensor, history: UserItemCSR, gf: GraphFilter) -> None:
    if history.num_users != queries.shape[0] or not history.num_items == items.shape[0] == gf.num_items:
        raise ValueError(
            f"history is ({history.num_users} users, {history.num_items} items), queries {tuple(queries.shape)}, "
            f"items {tuple(items.shape)}, graph filter {gf.num_items} items"
        )


def fused_topk(
    queries: torch.Tensor,
    items: torch.Tensor,
    gf: GraphFilter,
    history: UserItemCSR,
    k: int,
    *,
    alpha: float,
    beta: float,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the fused score per query (row u of ``history``: user u's known items, the filter's input)."""
    _check_inputs(queries, items, history, gf)
    items_t = items.float().t()

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        cos = queries[start:stop].float() @ items_t
        linear, low = gf.parts(_rows(history, start, stop))
        return fused_scores(cos, linear, low, alpha, beta)

    return chunked_topk(score_chunk, queries.shape[0], items.shape[0], k, exclude=exclude, chunk_size=chunk_size)


def graph_filter_topk(
    gf: GraphFilter,
    history: UserItemCSR,
    k: int,
    *,
    alpha: float,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of GF-CF alone (``linear + alpha * low``) per row of ``history``, with ``exact_topk``'s masking and ties."""
    if history.num_items != gf.num_items:
        raise ValueError(f"history has {history.num_items} items, the graph filter {gf.num_items}")

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        linear, low = gf.parts(_rows(history, start, stop))
        return torch.add(linear, low, alpha=alpha, out=out)

    return chunked_topk(score_chunk, history.num_users, gf.num_items, k, exclude=exclude, chunk_size=chunk_size)


def tune_fusion(
    queries: torch.Tensor,
    items: torch.Tensor,
    gf: GraphFilter,
    history: UserItemCSR,
    relevant: UserItemCSR,
    *,
    alphas: Sequence[float],
    betas: Sequence[float],
    rank: int,
    metric: str,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    top: int = 0,
) -> tuple[FusionChoice, torch.Tensor]:
    """The (alpha, beta) of the grid with the best ``metric`` (e.g. "recall@20") on these users (ties: the
    first), and that point's top-k ids [U, k], k = max(``top``, the metric's cut-off)."""
    _check_inputs(queries, items, history, gf)
    name, _, cutoff = metric.partition("@")
    k = max(int(cutoff), top)
    # beta = 0 ranks as the two-tower whatever alpha is: one point for it
    grid = [(float(alphas[0]), 0.0)] * (0.0 in betas) + [(float(a), float(b)) for a in alphas for b in betas if b]
    ids = {point: torch.empty(queries.shape[0], k, dtype=torch.int64) for point in grid}
    items_t = items.float().t()
    for start in range(0, queries.shape[0], chunk_size):
        stop = min(start + chunk_size, queries.shape[0])
        linear, low = gf.parts(_rows(history, start, stop))
        cos = _spread_normalised(queries[start:stop].float() @ items_t)
        buffer = torch.empty_like(cos)
        for alpha in dict.fromkeys(a for a, _ in grid):  # each spread once per alpha, each sum once per point
            filtered = _spread_normalised(linear + alpha * low)
            for point in (p for p in grid if p[0] == alpha):
                scores = torch.add(cos, filtered, alpha=point[1], out=buffer)
                ids[point][start:stop] = topk_from_scores(scores, k, exclude=exclude, row_offset=start)[1]
    values = {
        point: compute_metrics(ids[point].numpy(), relevant, [int(cutoff)], num_items=items.shape[0])[metric]
        for point in grid
    }
    best = max(grid, key=lambda point: values[point])  # max keeps the first of equal values
    choice = FusionChoice(
        alpha=best[0],
        beta=best[1],
        rank=rank,
        grid={f"alpha={a:g},beta={b:g}": v for (a, b), v in values.items()},
        tuned_on=f"valid {metric}, {relevant.num_users} users",
    )
    return choice, ids[best]


def timed_fit(graph: UserItemCSR, rank: int, what: str) -> GraphFilter:
    start = time.perf_counter()
    gf = fit_graph_filter(graph, rank)
    log.info(
        "graph filter of %s: %d users x %d items, %d item pairs, rank %d (%.1f s)",
        what,
        graph.num_users,
        graph.num_items,
        gf.item_item.nnz,
        gf.low_in.shape[1],
        time.perf_counter() - start,
    )
    return gf


class GraphFilterFusion:
    """One training stage's fused rankings: (alpha, beta) tuned on valid, then test ranked with them.

    With one alpha and one beta (a refit given its selection stage's choice) no valid is needed.
    """

    def __init__(
        self,
        *,
        alphas: Sequence[float],
        betas: Sequence[float],
        rank: int,
        max_pairs: int,
        metric: str,
        ks: Sequence[int],
        chunk_size: int,
    ) -> None:
        self.alphas, self.betas, self.rank, self.max_pairs = list(alphas), list(betas), rank, max_pairs
        self.metric, self.ks, self.chunk_size = metric, sorted(ks), chunk_size
        self.choice: FusionChoice | None = None
        self.skipped = ""
        self.seconds = 0.0

    def describe(self) -> dict:
        if self.skipped:
            return {"skipped": self.skipped}
        return {**(self.choice.describe() if self.choice else {}), "seconds": round(self.seconds, 1)}

    def evaluate(
        self,
        split: str,
        queries: torch.Tensor,
        items: torch.Tensor,
        *,
        graph: UserItemCSR,
        history: UserItemCSR,
        relevant: UserItemCSR,
    ) -> dict[str, float] | None:
        """Metrics of the fused ranking of ``split`` (None when skipped): ``graph`` is every user's known
        items (the filter is built from it), ``history`` the evaluated users' rows of it (also masked)."""
        self.skipped = too_many_pairs(graph, self.max_pairs)
        if self.skipped:
            log.info("graph filter skipped (eval.graph_filter.max_pairs): %s", self.skipped)
            return None
        start = time.perf_counter()
        gf = timed_fit(graph, self.rank, f"the splits before {split}")
        common = dict(exclude=history, chunk_size=self.chunk_size)
        if self.choice is None and len(self.alphas) * len(self.betas) == 1:
            self.choice = FusionChoice(self.alphas[0], self.betas[0], self.rank, tuned_on="given (eval.graph_filter)")
        if self.choice is None:
            if split != "valid":
                raise ValueError(
                    f"eval.graph_filter: a grid of alphas {self.alphas} x betas {self.betas} is chosen on valid, "
                    f"and {split!r} came first; give one alpha and one beta to rank {split} without valid"
                )
            # the grid ranks the top max(ks) of every point: the chosen point's ranking is already there
            self.choice, ids = tune_fusion(
                queries, items, gf, history, relevant, alphas=self.alphas, betas=self.betas, rank=self.rank,
                metric=self.metric, top=max(self.ks), **common,
            )  # fmt: skip
            log.info(
                "graph filter: alpha %g, beta %g chosen on %s",
                self.choice.alpha,
                self.choice.beta,
                self.choice.tuned_on,
            )
        else:
            _, ids = fused_topk(
                queries, items, gf, history, max(self.ks), alpha=self.choice.alpha, beta=self.choice.beta, **common
            )  # fmt: skip
        self.seconds += time.perf_counter() - start
        return compute_metrics(ids.numpy(), relevant, self.ks, num_items=items.shape[0])
