"""The graph filter's settings (``eval.settings.graph_filter``: conf/eval/rankers/graph_filter.yaml), their rules,
its resource check (the fit's memory, refused before any training) and its cost estimate (``estimate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.need import Need
from recsys.rankers.cost import RankerCost
from recsys.rankers.graph_filter.spectral import fit_seconds
from recsys.rankers.resources import Resources


@dataclass
class GraphFilterSettings:
    """GF-CF's filter sharpened as BSPM, over the top ``rank`` eigenpairs of the user-item graph, so that it is a
    dot product the serving bundle ships (recsys/rankers/graph_filter/ranker.py)."""

    # weights of the low-pass filter, chosen on valid when more than one (one by default: BSPM's 0.2; why not a grid:
    # docs/quality.md, "The low-pass weight")
    alphas: list[float] = field(default_factory=lambda: [0.2])
    # BSPM's sharpening times (one RK4 step of dU/dt = -U R~'R~; 0: GF-CF unsharpened), chosen on valid
    sharpen: list[float] = field(default_factory=lambda: [2.5])
    rank: int = 2048  # eigenpairs of R~'R~ the linear filter keeps: the width of its query / item vectors
    low_rank: int = 256  # eigenvectors of the ideal low-pass filter (GF-CF's 256), among the rank kept
    iterations: int = 3  # subspace iterations of the randomized eigensolver (each one pass over the interactions)
    oversample: int = 64  # extra columns the eigensolver carries beyond rank (accuracy of the last eigenpairs)


def check_settings(s: GraphFilterSettings, need: Need, key: str) -> None:
    for name, values in (("alphas", s.alphas), ("sharpen", s.sharpen)):
        ok = len(values) > 0 and all(v >= 0 for v in values)
        need(ok, f"{key}.{name}", list(values), "must be a non-empty list of values >= 0")
    for name in ("rank", "low_rank", "iterations"):
        need(getattr(s, name) >= 1, f"{key}.{name}", getattr(s, name), "must be >= 1")
    need(s.oversample >= 0, f"{key}.oversample", s.oversample, "must be >= 0")


def fit_peak_bytes(num_items: int, interactions: int, *, rank: int, low_rank: int, oversample: int) -> int:
    """Estimated memory one fit holds at its peak, with its vectors: four [I, rank + oversample] float32 blocks
    of the eigensolver, the query table and item vectors [I, rank + low_rank] each, and the normalised graph
    and its transpose (CSR, int64 indices: 24 bytes an interaction each); its accuracy against
    scripts/bench_graph_filter.py's measured peaks: docs/performance.md."""
    rank = min(rank, num_items)
    width = min(num_items, rank + oversample)
    return 4 * num_items * (4 * width + 2 * (rank + min(low_rank, rank))) + 48 * interactions


def check_resources(s: GraphFilterSettings, r: Resources, key: str) -> str:
    """The refusal of a fit that would not fit in the memory available ("" when it fits or memory is unknown)."""
    if r.available_bytes is None:
        return ""
    need = r.fits_per_host * fit_peak_bytes(
        r.num_items, r.interactions, rank=s.rank, low_rank=s.low_rank, oversample=s.oversample
    )
    if need <= r.available_bytes:
        return ""
    per_host = (
        f"{r.fits_per_host} fits on this host (one per rank with data.shard_by_user), " if r.fits_per_host > 1 else ""
    )
    return (
        f"{key}.rank={s.rank}: the graph filter's fit after training over {r.num_items:,} items and "
        f"{r.interactions:,} interactions needs about {need / 2**30:.1f} GiB ({per_host}[items, rank] float32 blocks), "
        f"more than the {r.available_bytes / 2**30:.1f} GiB available: lower {key}.rank (the memory is "
        "about proportional to it; docs/performance.md, 'The servable graph filter as the catalogue grows') or "
        "leave the graph filter out (eval.rankers=[two_tower,popularity])"
    )


def estimate(s: GraphFilterSettings, r: Resources) -> RankerCost:
    """Its fit (``spectral.fit_seconds``, ``fit_peak_bytes``) and its scoring: per sharpening time a pass that pools the
    users' query vectors and sharpens the low-pass items (4 passes through R~ of [I, low_rank]), then a
    [chunk, rank + low_rank] x [rank + low_rank, I] GEMM a block; one add per alpha."""
    t = r.throughput
    rank = max(1, min(s.rank, r.num_items))
    low = min(s.low_rank, rank)
    fit = fit_seconds(
        r.num_items, r.num_users, r.interactions, rank, oversample=s.oversample, iterations=s.iterations, t=t
    )
    points = len(s.alphas) * len(s.sharpen)
    return RankerCost(
        fit_seconds=fit,
        peak_bytes=fit_peak_bytes(r.num_items, r.interactions, rank=rank, low_rank=low, oversample=s.oversample),
        score_s=t.dense(2 * (rank + low)),
        width=rank + low,
        points=points,
        passes=len(s.sharpen),
        pass_seconds=t.sparse(2 * r.interactions * (rank + low) + 16 * r.interactions * low),
        point_s=t.ns(t.add_ns) if len(s.alphas) > 1 else 0.0,
        what=f"rank {rank}",
    )
