"""GF-CF's graph filter, sharpened as BSPM, as a dot product over the graph's top spectrum.

GF-CF (Shen et al., CIKM 2021) scores user u's items r_u (binary [I]) as

    gf(u) = r_u P~  +  alpha * r_u D_i^-1/2 V_k V_k' D_i^1/2          (P~ = R~'R~, recsys.rankers.graph_filter.spectral)

a linear filter (item-item co-occurrence) plus an ideal low-pass filter on the top ``low_rank`` = k
eigenvectors V_k; BSPM (Choi et al., SIGIR 2023) sharpens it: gf(u) p(-T P~), p = exp's Taylor polynomial
of order 4 (one RK4 step of dU/dt = -U P~ over [0, T]). Here P~ in the linear filter is its top ``rank`` = m
eigenpairs, P~ ~ V diag(lambda) V', so that the whole filter is an inner product of two vectors:

    query(u) = sum over j in r_u of  [ V[j] , alpha * d_j^-1/2 V_k[j] ]                  [m + k]
    item(i)  =                        [ V[i] * lambda p(-T lambda) , (V_k' D_i^1/2 p(-T P~))[:, i] ]

The query is a sum-pooled bag over the user's items (an EmbeddingBag over ``query_table``), the items a
matrix an ANN index serves: what a run measures is what the bundle ships. The low-pass part is exact (its
sharpening runs through the sparse graph); the linear part keeps the top m of P~'s spectrum, which ranks
a little below the full-rank filter (docs/quality.md) and scales with the catalogue as I x (m + k) floats.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from recsys.rankers.base import DotProductFit, EvalSplit, Fit, Point, Ranker, blockwise_topk
from recsys.rankers.graph_filter.part import GraphFilterPart
from recsys.rankers.graph_filter.spectral import Reduce, Spectrum, fit_spectrum
from recsys.rankers.served import Served

log = logging.getLogger(__name__)


def sharpening_coefficients(sharpen: float) -> list[float]:
    """c_n with p(-T P~) = sum_n c_n P~^n: one RK4 step of dU/dt = -U P~ over [0, T] is exp(-T P~)'s Taylor
    polynomial of order 4 (BSPM's published setting: T = 2.5, one step); T = 0 leaves the filter as it is."""
    if sharpen == 0:
        return [1.0]
    return [(-sharpen) ** n / math.factorial(n) for n in range(5)]


@dataclass
class GraphFilterVectors:
    """The filter of one spectrum in dot-product form, every part kept apart so a grid reuses them."""

    linear_query: torch.Tensor  # float32 [I, m]: V, summed over a user's items
    low_query: torch.Tensor  # float32 [I, k]: D_i^-1/2 V_k, summed over a user's items
    spectrum: Spectrum
    low_rank: int

    @classmethod
    def of(cls, spectrum: Spectrum, low_rank: int) -> GraphFilterVectors:
        k = min(low_rank, spectrum.rank)
        inv_sqrt = torch.where(
            spectrum.item_degree > 0, spectrum.item_degree.clamp_min(1e-12).rsqrt(), torch.zeros(())
        ).float()
        return cls(spectrum.vectors, (spectrum.vectors[:, :k] * inv_sqrt[:, None]).contiguous(), spectrum, k)

    def linear_items(self, sharpen: float) -> torch.Tensor:
        """float32 [I, m]: V diag(lambda p(-T lambda))."""
        lam = self.spectrum.values
        weights = lam * sum(c * lam**n for n, c in enumerate(sharpening_coefficients(sharpen)))
        return (self.spectrum.vectors * weights.float()[None]).contiguous()

    def low_items(self, sharpen: float) -> torch.Tensor:
        """float32 [I, k]: (V_k' D_i^1/2 p(-T P~))', the low-pass filter's output map, sharpened through the graph."""
        start = self.spectrum.vectors[:, : self.low_rank] * self.spectrum.item_degree.sqrt().float()[:, None]
        coefficients = sharpening_coefficients(sharpen)
        out, power = start * coefficients[0], start
        for c in coefficients[1:]:
            power = self.spectrum.propagate_columns(power)
            out.add_(power, alpha=c)
        return out.contiguous()

    def query_table(self, alpha: float) -> torch.Tensor:
        """float32 [I, m + k]: row j is what item j adds to a query (sum pooling)."""
        return torch.cat([self.linear_query, alpha * self.low_query], dim=1)

    def item_vectors(self, sharpen: float) -> torch.Tensor:
        """float32 [I, m + k]."""
        return torch.cat([self.linear_items(sharpen), self.low_items(sharpen)], dim=1)


class GraphFilterFit(DotProductFit):
    """The filter of one split's graph; item vectors are built once per sharpening time and kept."""

    def __init__(self, vectors: GraphFilterVectors, seconds: float) -> None:
        self.parts, self.seconds = vectors, seconds
        self._items: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}

    def items(self, sharpen: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear [I, m], low-pass [I, k]) item vectors at ``sharpen`` (computed once, a pure function of it)."""
        if sharpen not in self._items:
            self._items[sharpen] = (self.parts.linear_items(sharpen), self.parts.low_items(sharpen))
        return self._items[sharpen]

    def vectors(self, split: EvalSplit, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        queries = split.pool_history(self.parts.query_table(point["alpha"]))
        return queries, torch.cat(self.items(point["sharpen"]), dim=1)

    def score_blocks(
        self, split: EvalSplit, start: int, stop: int, points: Sequence[Point]
    ) -> Iterator[tuple[Point, torch.Tensor]]:
        """Each sharpening time's linear and low-pass scores once, then every alpha from them."""
        history = split.history_block(start, stop)
        linear_q, low_q = history @ self.parts.linear_query, history @ self.parts.low_query
        for sharpen in dict.fromkeys(p["sharpen"] for p in points):
            linear_i, low_i = self.items(sharpen)
            linear, low = linear_q @ linear_i.t(), low_q @ low_i.t()
            for point in (p for p in points if p["sharpen"] == sharpen):
                yield point, torch.add(linear, low, alpha=point["alpha"])

    def topk(self, split: EvalSplit, k: int, points: Sequence[Point], chunk_size: int) -> dict[str, torch.Tensor]:
        if len(points) == 1:
            return super().topk(split, k, points, chunk_size)
        return blockwise_topk(split, k, points, chunk_size, lambda a, b: self.score_blocks(split, a, b, points))

    def served(self, point: Point) -> Served:
        """The query table at ``alpha`` and the item vectors at ``sharpen`` (recsys/rankers/graph_filter/part.py)."""
        items = torch.cat(self.items(point["sharpen"]), dim=1)
        return Served([GraphFilterPart(items, query_table=self.parts.query_table(point["alpha"]))], [1.0])

    def info(self) -> dict:
        s = self.parts.spectrum
        return {
            "interactions": int(s.norm._nnz()),
            "rank": s.rank,
            "low_rank": self.parts.low_rank,
            "smallest_eigenvalue": float(s.values[-1]) if s.rank else 0.0,
            "seconds": round(self.seconds, 1),
        }


class GraphFilterRanker(Ranker):
    """BSPM's sharpened GF-CF filter over the top ``rank`` of the graph's spectrum (module docstring)."""

    name = "graph_filter"
    servable = True

    def __init__(
        self,
        *,
        alphas: Sequence[float],
        sharpens: Sequence[float],
        rank: int,
        low_rank: int,
        iterations: int,
        oversample: int,
        seed: int = 0,
        reduce: Reduce | None = None,
    ) -> None:
        """``reduce``: the ranks hold the users' rows between them, each split's graph being this rank's rows;
        the fit's sums over users are reduced across them (every rank gets the same filter)."""
        self.alphas, self.sharpens = [float(a) for a in alphas], [float(t) for t in sharpens]
        self.rank, self.low_rank, self.iterations, self.oversample = rank, low_rank, iterations, oversample
        self.seed, self.reduce = seed, reduce

    def grid(self) -> list[Point]:
        return [{"alpha": a, "sharpen": t} for t in self.sharpens for a in self.alphas]

    def settings(self) -> dict:
        return {
            "rank": self.rank,
            "low_rank": self.low_rank,
            "iterations": self.iterations,
            "oversample": self.oversample,
            "score": "(r V diag(l p(-T l)) V' + alpha r D^-1/2 V_k V_k' D^1/2 p(-T P~)), P~ = R~'R~ ~ V diag(l) V' "
            "(top `rank` eigenpairs), p = exp's Taylor polynomial of order 4 (GF-CF, sharpened as BSPM)",
        }

    def fit(self, split: EvalSplit, fits: Mapping[str, Fit]) -> Fit:
        start = time.perf_counter()
        spectrum = fit_spectrum(
            split.graph,
            self.rank,
            oversample=self.oversample,
            iterations=self.iterations,
            seed=self.seed,
            **({"reduce": self.reduce} if self.reduce is not None else {}),
        )
        vectors = GraphFilterVectors.of(spectrum, self.low_rank)
        seconds = time.perf_counter() - start
        log.info(
            "graph filter of %s: %d users x %d items, %d interactions, top %d eigenpairs (smallest %.3f), %.1f s",
            split.fit_on,
            split.graph.num_users,
            split.graph.num_items,
            split.graph.nnz,
            spectrum.rank,
            float(spectrum.values[-1]) if spectrum.rank else 0.0,
            seconds,
        )
        return GraphFilterFit(vectors, seconds)
