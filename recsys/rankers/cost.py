"""What a ranker costs before any work: each ranker package's ``estimate(settings, resources) -> RankerCost`` (beside
its resource check), fixed formulas of FLOPs and bytes over this host's measured throughput, and the formulas that
turn them into the evaluation stage's seconds (a ranker ranking a split at its grid, a fusion of two).

    cost = graph_filter.settings.estimate(settings, resources)       # RankerCost: its fit, its scoring
    seconds = ranking_seconds(cost, host_throughput(), users=29_858, items=40_981, points=1)   # test: one point

The rates are those of one thread of the 2-core box the project measures on (AMD EPYC, torch 2.13 CPU), measured by
``scripts/stage_costs.py --calibrate`` and checked against whole stages there (docs/performance.md, "What the
evaluation stage costs"); a host's rate is one thread's times its torch threads. Other CPUs differ by their speed:
the estimates are what this box would take, a bound that says "seconds", "minutes" or "an hour", not a timing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

GB = 1e9


@dataclass(frozen=True)
class Throughput:
    """One thread's rates (docs/performance.md, "What the evaluation stage costs"; measured 2026-12-06 with the box
    quiet: other jobs on its two cores slow GEMMs 2-3x and MKL's factorisations up to 20x), and the threads a host runs
    them on."""

    dense_gflops: float = 90.0  # float32 GEMM: score blocks, CholeskyQR's products
    sparse_gflops: float = 2.3  # sparse CSR x dense float32 (torch): the graph filter's passes through R~, EASE's X'X
    factor64_gflops: float = 25.0  # EASE's Cholesky factor and inverse in float64, counted as I^3 FLOPs
    factor32_gflops: float = 60.0  # the same in float32
    select_ns: float = 1.0  # one score masked and passed through the top-k heaps
    add_ns: float = 3.0  # one score of a new block from an elementwise op (a fusion's weighted add)
    spread_ns: float = 6.0  # one score of a block divided by its row's spread (a fusion's parts)
    ials_ns: float = 1.5  # implicit's ALS: per iteration x (interactions x D + (users + items) x D^2)
    eigh_ns: float = 0.15  # a symmetric float64 eigendecomposition, per n^3, one thread (MKL's, at n ~ 2k)
    threads: int = 1

    def on(self, threads: int) -> Throughput:
        return replace(self, threads=max(1, threads))

    def dense(self, flops: float) -> float:
        return flops / (self.dense_gflops * GB * self.threads)

    def sparse(self, flops: float) -> float:
        return flops / (self.sparse_gflops * GB * self.threads)

    def eigh(self, n: int) -> float:
        """Seconds of ``torch.linalg.eigh`` of an [n, n] float64 matrix (one thread whatever the host's)."""
        return self.eigh_ns * 1e-9 * n**3

    def ns(self, per_thread_ns: float) -> float:
        """Seconds of ``per_thread_ns`` on this host (ns of one thread, shared by its threads)."""
        return per_thread_ns * 1e-9 / self.threads


def host_throughput() -> Throughput:
    """The measured rates on this process's torch threads."""
    return Throughput().on(torch.get_num_threads())


@dataclass(frozen=True)
class RankerCost:
    """One ranker's cost on a dataset: its fit, and what ranking costs per (user, item) pair and per grid point.

    A split ranked at P points of a grid that needs ``passes`` scoring passes costs
    ``passes x (pass_seconds + U I score_s) + P U I (point_s + select)`` (``ranking_seconds``)."""

    fit_seconds: float = 0.0  # one fit on the interactions test follows (valid's, on fewer, taken as the same)
    peak_bytes: int = 0  # what one fit holds at its peak and keeps for ranking
    score_s: float = 0.0  # seconds per (user, item) pair of one scoring pass (its matmul)
    test_score_s: float | None = None  # the same at one point, where that ranks otherwise (EASE's dense product)
    width: int = 0  # its vectors' width D (a fusion's covariance and queries: 2 I D^2 FLOPs)
    points: int = 1  # its grid's points
    passes: int = 1  # scoring passes its grid needs (points that share one count once: the graph filter's alphas)
    pass_seconds: float = 0.0  # per pass, whatever the users (EASE's factorisation of a λ, iALS's fit of a point)
    point_s: float = 0.0  # per (user, item) pair and point, beyond the selection (the graph filter's add per alpha)
    one_point_per_pass: bool = False  # DotProductFit.one_point_per_pass: a fusion ranks its points one at a time
    pairwise: bool = True  # it scores and selects among every (user, item) pair; False: per user (popularity's head)
    user_s: float = 0.0  # per user ranked, whatever the items
    what: str = ""  # a few words on the fit's size, for the log ("rank 2048", "7 λ in float64")


def ranking_seconds(cost: RankerCost, t: Throughput, *, users: int, items: int, points: int) -> float:
    """One ranker alone ranking ``users`` x ``items`` at ``points`` points of its grid (1: test's)."""
    pairs = users * items
    select = t.ns(t.select_ns) if cost.pairwise else 0.0
    per_user = points * users * cost.user_s
    if points == 1:
        return cost.pass_seconds + pairs * (one_point_score(cost) + select) + per_user
    scoring = cost.passes * (cost.pass_seconds + pairs * cost.score_s)
    return scoring + points * pairs * (cost.point_s + select) + per_user


def one_point_score(cost: RankerCost) -> float:
    return cost.score_s if cost.test_score_s is None else cost.test_score_s


def fusion_seconds(
    first: RankerCost, second: RankerCost, t: Throughput, *, users: int, items: int, betas: Sequence[float]
) -> tuple[float, float]:
    """(valid at the fusion's grid, test at one point) of ``first+second`` (recsys/rankers/fusion.py): on valid each
    block's part scores divided by their spread, one weighted add and one selection per point; on test the fused
    vectors (each part's covariance, 2 I D^2) ranked at once."""
    pairs = users * items
    points = fusion_points(first, second, betas)
    groups = second.points if second.one_point_per_pass else 1  # the first part's scores again for each group
    valid = (
        groups * pairs * (first.score_s + t.ns(t.spread_ns))
        + first.pass_seconds
        + second.passes * (second.pass_seconds + pairs * (second.score_s + t.ns(t.spread_ns)))
        + second.points * pairs * second.point_s
        + points * pairs * t.ns(t.add_ns + t.select_ns)
    )
    covariance = t.dense(2 * items * (first.width**2 + second.width**2))
    test = (
        first.pass_seconds
        + second.pass_seconds
        + covariance
        + pairs * (one_point_score(first) + one_point_score(second) + t.ns(t.select_ns))
    )
    return valid, test


def fusion_points(first: RankerCost, second: RankerCost, betas: Sequence[float]) -> int:
    """The fusion's grid (recsys.rankers.fusion.FusionRanker.grid): beta = 0 once, every other beta at every pair of
    the parts' points."""
    nonzero = sum(1 for b in betas if b)
    return (1 if len(betas) > nonzero else 0) + nonzero * first.points * second.points


def dot_product_cost(width: int, t: Throughput, *, chunk_size: int = 4096, items: int = 0) -> RankerCost:
    """A ranker with its vectors ready (the two-tower's embeddings): a [chunk, D] x [D, I] GEMM a block."""
    return RankerCost(score_s=t.dense(2 * width), width=width, peak_bytes=4 * chunk_size * items)
