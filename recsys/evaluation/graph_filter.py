"""GF-CF's graph filter (Shen et al., CIKM 2021) and its fusion with the two-tower's ranking scores.

Built from binary interactions R [users, items] (the evaluated split's preceding splits, every user),
normalised as LightGCN does, R~ = D_u^-1/2 R D_i^-1/2, the filter scores user u's items r_u as

    gf(u) = r_u R~'R~  +  alpha * r_u D_i^-1/2 V V' D_i^1/2

a linear filter (item-item co-occurrence, each shared user weighted 1/d_u, each pair 1/sqrt(d_i d_j))
plus an ideal low-pass filter (V: the top ``rank`` right singular vectors of R~). BSPM (Choi et al.,
SIGIR 2023) then sharpens it: the ODE dU/dt = -U P~ (P~ = R~'R~) run from U(0) = gf(u) for a time
``sharpen`` in one RK4 step, i.e. gf(u) times exp(-sharpen P~)'s Taylor polynomial of order 4, which
takes back the blur of over-popular neighbourhoods (sharpen = 0: GF-CF as is). The fused score is

    s(u) = cos(u) / std(cos(u)) + beta * gf(u) / std(gf(u))

each term divided by its spread over the user's scores of all items, so beta weighs like against
like; beta = 0 ranks as the two-tower alone. alpha, the sharpening time and beta are chosen on valid
from a grid (``tune_fusion``). On Gowalla the two scores are complementary: the two-tower alone 0.1730
test Recall@20, BSPM alone 0.1921, fused 0.1940 (docs/quality.md, sections 15 and 16).

Cost: P~ (one entry per co-occurring item pair, Gowalla: 36M for 41k items) is never built: each
block of users' dense rows goes through R~ and back, R~'(R~ x), once for the linear filter and four
more times for the sharpening; the low-pass part's sharpening is folded into V' once. It all runs on
one host, with ``max_pairs`` bounding sum_u d_u^2 (the pairs the filter weighs) before anything is
allocated, and ``memory_gb`` bounding a block's dense arrays: the users per block shrink as the catalogue
grows (``block_rows``).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
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
# default bound on one block's dense arrays (eval.graph_filter.memory_gb): Gowalla keeps its 4096-user blocks
# (4 GB would take them to 2,183 users: peak RSS 10.0 -> 6.0 GB, but the valid grid 2:22 -> 3:15; section 18)
MEMORY_GB = 8.0
# [rows, I] float32 arrays live at a block's peak, as measured (RSS) for tune_fusion's default grid (two
# sharpening times): the input rows, the powers of P~, each time's linear and low-pass parts and their
# transposes, the two-tower's scores, the fused buffer, the spread's temporaries
BLOCK_ARRAYS = 12


def block_rows(chunk_size: int, num_items: int, memory_gb: float = MEMORY_GB) -> int:
    """Users per block: ``chunk_size``, fewer where BLOCK_ARRAYS [rows, num_items] float32 arrays would pass
    ``memory_gb`` (Gowalla's 41k items: 4096 at 8 GB, 2,183 at 4 GB), at least 1."""
    if memory_gb <= 0:
        raise ValueError(f"memory_gb must be > 0, got {memory_gb}")
    fits = int(memory_gb * 2**30 // (BLOCK_ARRAYS * 4 * max(num_items, 1)))
    return max(1, min(chunk_size, fits))


def sharpening_coefficients(sharpen: float) -> list[float]:
    """c_n with U(T) = U(0) sum_n c_n P~^n: one RK4 step of dU/dt = -U P~ over [0, T] is exp(-T P~)'s Taylor
    polynomial of order 4 (BSPM's Gowalla setting: T = 2.5, one step); T = 0 leaves U(0) as it is."""
    if sharpen == 0:
        return [1.0]
    return [(-sharpen) ** n / math.factorial(n) for n in range(5)]


@dataclass
class GraphFilter:
    """The two filters of one interaction graph, ready to score rows of users' items."""

    norm: torch.Tensor  # sparse CSR float32 [U, I]: R~; P~ = R~'R~ is applied as R~'(R~ x), never built
    norm_t: torch.Tensor  # sparse CSR float32 [I, U]: R~'
    low_in: torch.Tensor  # float32 [I, k]: D_i^-1/2 V
    low_out: torch.Tensor  # float32 [k, I]: V' D_i^1/2
    _low_out_sharpened: dict[float, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_items(self) -> int:
        return int(self.norm.shape[1])

    @property
    def num_interactions(self) -> int:
        return int(self.norm._nnz())

    def propagate(self, rows: torch.Tensor) -> torch.Tensor:
        """rows P~ for dense float32 rows [C, I] (two sparse products through the users)."""
        return self._propagate_columns(rows.t()).t()

    def _propagate_columns(self, columns: torch.Tensor) -> torch.Tensor:
        # P~ is symmetric: P~ x' for columns x' [I, C]; R~ has one entry per interaction, P~ one per
        # co-occurring pair (Gowalla: 0.7M against 36M), and a block of rows costs 2 x nnz(R~) x C
        return self.norm_t @ (self.norm @ columns)

    def _sharpened(self, start: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
        out, power = start * coefficients[0], start
        for c in coefficients[1:]:
            power = self.propagate(power)
            out.add_(power, alpha=c)
        return out

    def low_out_sharpened(self, sharpen: float) -> torch.Tensor:
        """V' D_i^1/2 p(P~) [k, I], the low-pass filter's output map with the sharpening folded in."""
        if sharpen not in self._low_out_sharpened:
            self._low_out_sharpened[sharpen] = self._sharpened(self.low_out, sharpening_coefficients(sharpen))
        return self._low_out_sharpened[sharpen]

    def parts(
        self, rows: sp.csr_matrix, sharpens: Sequence[float] = (0.0,)
    ) -> dict[float, tuple[torch.Tensor, torch.Tensor]]:
        """(linear, low-pass) float32 [C, I] of the binary item rows ``rows`` [C, I], each sharpened for
        each time in ``sharpens`` (the powers of P~ computed once for all of them)."""
        # column-wise ([I, C]) until the end: the products need no transposes and the sums run contiguous
        columns = torch.from_numpy(rows.T.toarray().astype(np.float32, copy=False))
        power = self._propagate_columns(columns)  # the linear filter, r P~
        coefficients = {float(t): sharpening_coefficients(t) for t in sharpens}
        out = {t: power if len(c) == 1 else power * c[0] for t, c in coefficients.items()}
        for n in range(1, max(len(c) for c in coefficients.values())):
            power = self._propagate_columns(power)
            for t, c in coefficients.items():
                if n < len(c):
                    out[t].add_(power, alpha=c[n])
        low_rows = columns.t() @ self.low_in
        return {t: (out[t].t().contiguous(), low_rows @ self.low_out_sharpened(t)) for t in coefficients}


def too_many_pairs(graph: UserItemCSR, max_pairs: int) -> str:
    """Why the filter of ``graph`` is not built ("" when it is): sum_u d_u^2 bounds the item pairs it
    weighs (P~'s entries), checked before anything is allocated."""
    lengths = graph.lengths().astype(np.int64)
    pairs = int((lengths * lengths).sum())
    if pairs <= max_pairs:
        return ""
    return f"sum over users of (items per user)^2 = {pairs:,} > max_pairs={max_pairs:,}: too many item pairs for the graph filter on one host"


def fit_graph_filter(graph: UserItemCSR, rank: int) -> GraphFilter:
    """GF-CF's filters of ``graph`` (binary, every user's items); ``rank`` is capped below min(U, I)."""
    num_users, num_items = graph.num_users, graph.num_items
    r = _rows(graph, 0, num_users).astype(np.float64)
    user_deg = np.asarray(r.sum(axis=1)).ravel()
    item_deg = np.asarray(r.sum(axis=0)).ravel()
    inv_sqrt = lambda d: np.where(d > 0, 1.0 / np.sqrt(np.maximum(d, 1e-12)), 0.0)  # noqa: E731
    norm = (sp.diags(inv_sqrt(user_deg)) @ r @ sp.diags(inv_sqrt(item_deg))).tocsr()
    norm32 = norm.astype(np.float32)
    k = max(1, min(rank, min(num_users, num_items) - 1))
    vt = torch.from_numpy(
        np.ascontiguousarray(_top_right_singular_vectors(norm, k), dtype=np.float32)
    )  # [k, I]; V V' ignores signs and order
    low_in = (vt * torch.from_numpy(inv_sqrt(item_deg).astype(np.float32))[None]).t().contiguous()
    low_out = vt * torch.from_numpy(np.sqrt(item_deg).astype(np.float32))[None]
    return GraphFilter(
        norm=_torch_csr(norm32),
        norm_t=_torch_csr(norm32.T.tocsr()),
        low_in=low_in,
        low_out=low_out,
    )


def _top_right_singular_vectors(norm: sp.csr_matrix, k: int) -> np.ndarray:
    """V' [k, I] of the top k singular values of ``norm``, the same on every run (a fixed start vector)."""
    v0 = np.ones(min(norm.shape), dtype=np.float64) / np.sqrt(min(norm.shape))
    try:  # PROPACK: 7 s on Gowalla against ARPACK's 20 s, the same subspace (principal angles' cosines 1 - 4e-12)
        return svds(norm, k=k, v0=v0, solver="propack")[2]
    except ValueError:  # scipy releases that make PROPACK opt-in (SCIPY_USE_PROPACK)
        return svds(norm, k=k, v0=v0)[2]


def _torch_csr(matrix: sp.csr_matrix) -> torch.Tensor:
    with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" note, once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(matrix.indptr.astype(np.int64)),
            torch.from_numpy(matrix.indices.astype(np.int64)),
            torch.from_numpy(matrix.data),
            size=matrix.shape,
        )


def _rows(history: UserItemCSR, start: int, stop: int) -> sp.csr_matrix:
    lo, hi = history.indptr[start], history.indptr[stop]
    return sp.csr_matrix(
        (np.ones(hi - lo, dtype=np.float32), history.indices[lo:hi], history.indptr[start : stop + 1] - lo),
        shape=(stop - start, history.num_items),
    )


def _spread_normalised(scores: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """scores / their standard deviation per row (a row of one value, no history, gives 0s)."""
    # the std as the centred row's norm: torch.std takes 0.47 s for a [4096, 41k] block here, this 0.10 s
    centred = scores - scores.mean(dim=1, keepdim=True)
    spread = torch.linalg.vector_norm(centred, dim=1, keepdim=True).div_(math.sqrt(max(scores.shape[1] - 1, 1)))
    del centred
    spread.clamp_min_(1e-12)
    return scores.div_(spread) if in_place else scores / spread


def fused_scores(cos: torch.Tensor, linear: torch.Tensor, low: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """The fused score [C, I] of the two-tower's scores ``cos`` and the filter's parts (module docstring)."""
    out = _spread_normalised(cos)
    if beta:  # torch.add as tune_fusion does: the chosen point ranks bit for bit as it was scored
        out = torch.add(out, _spread_normalised(torch.add(linear, low, alpha=alpha), in_place=True), alpha=beta)
    return out


@dataclass
class FusionChoice:
    """alpha, beta and the sharpening time of the fused score, and the valid metric of every grid point."""

    alpha: float
    beta: float
    rank: int
    sharpen: float = 0.0
    grid: dict[str, float] = field(default_factory=dict)  # grid_key(alpha, sharpen, beta) -> valid metric
    tuned_on: str = ""

    def describe(self) -> dict:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "sharpen": self.sharpen,
            "rank": self.rank,
            "grid": self.grid,
            "tuned_on": self.tuned_on,
            "score": "cos/std(cos) + beta * gf/std(gf), gf = (r R~'R~ + alpha * r D^-1/2 V V' D^1/2) p(-sharpen R~'R~), "
            "p = exp's Taylor polynomial of order 4 (GF-CF, sharpened as BSPM)",
        }


def grid_key(alpha: float, sharpen: float, beta: float) -> str:
    return f"alpha={alpha:g},sharpen={sharpen:g},beta={beta:g}"


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
    sharpen: float = 0.0,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    memory_gb: float = MEMORY_GB,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the fused score per query (row u of ``history``: user u's known items, the filter's input)."""
    _check_inputs(queries, items, history, gf)
    items_t = items.float().t()

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        cos = queries[start:stop].float() @ items_t
        linear, low = gf.parts(_rows(history, start, stop), [sharpen])[sharpen]
        return fused_scores(cos, linear, low, alpha, beta)

    rows = block_rows(chunk_size, gf.num_items, memory_gb)
    return chunked_topk(score_chunk, queries.shape[0], items.shape[0], k, exclude=exclude, chunk_size=rows)


def graph_filter_topk(
    gf: GraphFilter,
    history: UserItemCSR,
    k: int,
    *,
    alpha: float,
    sharpen: float = 0.0,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    memory_gb: float = MEMORY_GB,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the graph filter alone (``linear + alpha * low``, sharpened) per row of ``history``, with
    ``exact_topk``'s masking and ties."""
    if history.num_items != gf.num_items:
        raise ValueError(f"history has {history.num_items} items, the graph filter {gf.num_items}")

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        linear, low = gf.parts(_rows(history, start, stop), [sharpen])[sharpen]
        return torch.add(linear, low, alpha=alpha, out=out)

    rows = block_rows(chunk_size, gf.num_items, memory_gb)
    return chunked_topk(score_chunk, history.num_users, gf.num_items, k, exclude=exclude, chunk_size=rows)


def tune_graph_filter(
    gf: GraphFilter,
    history: UserItemCSR,
    relevant: UserItemCSR,
    *,
    alphas: Sequence[float],
    sharpens: Sequence[float],
    metric: str,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    memory_gb: float = MEMORY_GB,
) -> dict[tuple[float, float], float]:
    """``metric`` of the graph filter alone at every (alpha, sharpen) of the grid, ranked as
    ``graph_filter_topk`` ranks them, in one pass over the users (each block's powers of P~ computed once)."""
    cutoff = int(metric.partition("@")[2])
    grid = [(float(a), float(t)) for a in alphas for t in sharpens]
    ids = {point: torch.empty(history.num_users, cutoff, dtype=torch.int64) for point in grid}
    rows = block_rows(chunk_size, gf.num_items, memory_gb)
    for start in range(0, history.num_users, rows):
        stop = min(start + rows, history.num_users)
        for sharpen, (linear, low) in gf.parts(_rows(history, start, stop), sharpens).items():
            for point in (p for p in grid if p[1] == sharpen):
                scores = torch.add(linear, low, alpha=point[0])
                ids[point][start:stop] = topk_from_scores(scores, cutoff, exclude=exclude, row_offset=start)[1]
    return {
        point: compute_metrics(ids[point].numpy(), relevant, [cutoff], num_items=gf.num_items)[metric] for point in grid
    }


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
    sharpens: Sequence[float] = (0.0,),
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    memory_gb: float = MEMORY_GB,
    top: int = 0,
) -> tuple[FusionChoice, torch.Tensor]:
    """The (alpha, sharpen, beta) of the grid with the best ``metric`` (e.g. "recall@20") on these users (ties:
    the first), and that point's top-k ids [U, k], k = max(``top``, the metric's cut-off)."""
    _check_inputs(queries, items, history, gf)
    name, _, cutoff = metric.partition("@")
    k = max(int(cutoff), top)
    # beta = 0 ranks as the two-tower whatever the filter is: one point for it
    grid = [(float(alphas[0]), float(sharpens[0]), 0.0)] * (0.0 in betas) + [
        (float(a), float(t), float(b)) for t in sharpens for a in alphas for b in betas if b
    ]
    ids = {point: torch.empty(queries.shape[0], k, dtype=torch.int64) for point in grid}
    items_t = items.float().t()
    rows = block_rows(chunk_size, gf.num_items, memory_gb)
    for start in range(0, queries.shape[0], rows):
        stop = min(start + rows, queries.shape[0])
        cos = _spread_normalised(queries[start:stop].float() @ items_t)
        buffer = torch.empty_like(cos)
        for sharpen, (linear, low) in gf.parts(_rows(history, start, stop), sharpens).items():
            for alpha in dict.fromkeys(p[0] for p in grid if p[1] == sharpen):  # each spread once per filter
                filtered = _spread_normalised(torch.add(linear, low, alpha=alpha), in_place=True)
                for point in (p for p in grid if p[:2] == (alpha, sharpen)):
                    scores = torch.add(cos, filtered, alpha=point[2], out=buffer)
                    ids[point][start:stop] = topk_from_scores(scores, k, exclude=exclude, row_offset=start)[1]
    values = {
        point: compute_metrics(ids[point].numpy(), relevant, [int(cutoff)], num_items=items.shape[0])[metric]
        for point in grid
    }
    best = max(grid, key=lambda point: values[point])  # max keeps the first of equal values
    choice = FusionChoice(
        alpha=best[0],
        beta=best[2],
        rank=rank,
        sharpen=best[1],
        grid={grid_key(*point): v for point, v in values.items()},
        tuned_on=f"valid {metric}, {relevant.num_users} users",
    )
    return choice, ids[best]


def timed_fit(graph: UserItemCSR, rank: int, what: str) -> GraphFilter:
    start = time.perf_counter()
    gf = fit_graph_filter(graph, rank)
    log.info(
        "graph filter of %s: %d users x %d items, %d interactions, rank %d (%.1f s)",
        what,
        graph.num_users,
        graph.num_items,
        gf.num_interactions,
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
        sharpens: Sequence[float] = (0.0,),
        memory_gb: float = MEMORY_GB,
    ) -> None:
        self.alphas, self.betas, self.rank, self.max_pairs = list(alphas), list(betas), rank, max_pairs
        self.sharpens, self.memory_gb = list(sharpens), memory_gb
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
        common = dict(exclude=history, chunk_size=self.chunk_size, memory_gb=self.memory_gb)
        log.info(
            "graph filter: blocks of %d users (eval.chunk_size %d, eval.graph_filter.memory_gb %g)",
            block_rows(self.chunk_size, gf.num_items, self.memory_gb),
            self.chunk_size,
            self.memory_gb,
        )
        if self.choice is None and len(self.alphas) * len(self.betas) * len(self.sharpens) == 1:
            self.choice = FusionChoice(
                self.alphas[0], self.betas[0], self.rank, sharpen=self.sharpens[0], tuned_on="given (eval.graph_filter)"
            )
        if self.choice is None:
            if split != "valid":
                raise ValueError(
                    f"eval.graph_filter: a grid of alphas {self.alphas} x sharpen {self.sharpens} x betas {self.betas} "
                    f"is chosen on valid, and {split!r} came first; give one of each to rank {split} without valid"
                )
            # the grid ranks the top max(ks) of every point: the chosen point's ranking is already there
            self.choice, ids = tune_fusion(
                queries, items, gf, history, relevant, alphas=self.alphas, betas=self.betas, rank=self.rank,
                metric=self.metric, sharpens=self.sharpens, top=max(self.ks), **common,
            )  # fmt: skip
            log.info(
                "graph filter: alpha %g, sharpen %g, beta %g chosen on %s",
                self.choice.alpha,
                self.choice.sharpen,
                self.choice.beta,
                self.choice.tuned_on,
            )
        else:
            choice = self.choice
            _, ids = fused_topk(
                queries, items, gf, history, max(self.ks), alpha=choice.alpha, beta=choice.beta,
                sharpen=choice.sharpen, **common,
            )  # fmt: skip
        self.seconds += time.perf_counter() - start
        return compute_metrics(ids.numpy(), relevant, self.ks, num_items=items.shape[0])
