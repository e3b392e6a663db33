"""The top of the user-item graph's spectrum, the basis in which a graph filter becomes a dot product.

Built from binary interactions R [users, items] (every user's items of the splits an evaluated split
follows), normalised as LightGCN and GF-CF do, R~ = D_u^-1/2 R D_i^-1/2, the item-item operator
P~ = R~'R~ has eigenpairs (lambda, v) with 1 >= lambda >= 0. :func:`fit_spectrum` finds the top ``rank``
of them by randomized subspace iteration (Halko, Martinsson and Tropp 2011, algorithm 4.4, with a
Rayleigh-Ritz step): P~ is only ever applied as R~'(R~ X), a sum over users, so a caller that holds its
users' rows only (``reduce``: an all-reduce over ranks) fits the same spectrum as one host with every row.

    spectrum = fit_spectrum(graph, rank=1024)        # vectors [I, 1024], values [1024], descending
    spectrum.propagate(x)                            # x P~ for x [C, I], as R~'(R~ x')

Cost: each iteration applies P~ to an [I, rank + oversample] block (2 x nnz(R) x (rank + oversample)
multiply-adds) and orthonormalises it (Cholesky QR, twice: O(I (rank + oversample)^2)); memory is a few
[I, rank + oversample] float32 blocks (4 I (rank + oversample) bytes each); ``fit_seconds`` counts it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from recsys.rankers.cost import Throughput, host_throughput
from recsys.ranking.interactions import UserItemCSR
from recsys.utils.progress import track

Reduce = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over the ranks that share the graph's users


def _no_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class Spectrum:
    """The normalised graph and the top eigenpairs of its item-item operator P~ = R~'R~."""

    norm: torch.Tensor  # sparse CSR float32 [U, I]: R~ (this host's users' rows)
    norm_t: torch.Tensor  # sparse CSR float32 [I, U]: R~'
    item_degree: torch.Tensor  # float64 [I]: users per item, over every rank's users
    values: torch.Tensor  # float64 [rank]: eigenvalues of P~, descending
    vectors: torch.Tensor  # float32 [I, rank]: orthonormal eigenvectors, columns in the order of values
    reduce: Reduce = _no_reduce

    @property
    def num_items(self) -> int:
        return int(self.norm.shape[1])

    @property
    def rank(self) -> int:
        return int(self.values.shape[0])

    def propagate_columns(self, columns: torch.Tensor) -> torch.Tensor:
        """P~ x for columns x [I, C]: R~'(R~ x), summed over the ranks' users."""
        return self.reduce(self.norm_t @ (self.norm @ columns))


def normalised_graph(graph: UserItemCSR, reduce: Reduce = _no_reduce) -> tuple[sp.csr_matrix, np.ndarray]:
    """(R~ float32 CSR [U, I], the items' degrees float64 [I]) of ``graph``'s binary rows; item degrees
    are summed over the ranks (``reduce``), a user's degree is its own row's length."""
    rows = sp.csr_matrix(
        (np.ones(graph.nnz, dtype=np.float64), graph.indices, graph.indptr), shape=(graph.num_users, graph.num_items)
    )
    user_degree = graph.lengths().astype(np.float64)
    item_degree = reduce(torch.from_numpy(np.bincount(graph.indices, minlength=graph.num_items).astype(np.float64)))
    item_degree = item_degree.numpy()
    norm = sp.diags(_inverse_sqrt(user_degree)) @ rows @ sp.diags(_inverse_sqrt(item_degree))
    return norm.tocsr().astype(np.float32), item_degree


def _inverse_sqrt(degree: np.ndarray) -> np.ndarray:
    return np.where(degree > 0, 1.0 / np.sqrt(np.maximum(degree, 1e-12)), 0.0)


def torch_csr(matrix: sp.csr_matrix) -> torch.Tensor:
    with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" note, once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(matrix.indptr.astype(np.int64)),
            torch.from_numpy(matrix.indices.astype(np.int64)),
            torch.from_numpy(matrix.data),
            size=matrix.shape,
        )


def orthonormalise(block: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of ``block``'s columns [I, L] by Cholesky QR, done twice (CholeskyQR2, Yamamoto et
    al. 2015: as accurate as Householder QR for a well-conditioned block, and faster, being all matrix products); a rank-deficient block (a graph of lower rank than the block's width) takes Householder QR."""
    q = block
    for _ in range(2):
        chol, info = torch.linalg.cholesky_ex((q.t() @ q).double())
        if int(info) != 0:
            return torch.linalg.qr(block)[0].contiguous()
        q = torch.linalg.solve_triangular(chol.to(q.dtype), q.t(), upper=False).t()
    return q.contiguous()


def fit_seconds(
    num_items: int, num_users: int, interactions: int, rank: int, *, oversample: int, iterations: int, t: Throughput
) -> float:
    """Estimated seconds of ``fit_spectrum``: with w = rank + oversample columns, ``iterations`` + 1 passes through
    R~ and R~' (4 nnz w FLOPs each, sparse), ``iterations`` + 1 CholeskyQR2 (6 I w^2), the Rayleigh-Ritz product
    (2 U w^2) and the rotation of the basis (2 I w rank), dense, and the [w, w] eigendecomposition."""
    rank = max(1, min(rank, num_items))
    width = min(num_items, rank + oversample)
    sparse = (4 * iterations + 2) * interactions * width
    dense = (iterations + 1) * 6 * num_items * width**2 + 2 * num_users * width**2 + 2 * num_items * width * rank
    return t.sparse(sparse) + t.dense(dense) + t.eigh(width)


def fit_spectrum(
    graph: UserItemCSR,
    rank: int,
    *,
    oversample: int = 64,
    iterations: int = 3,
    seed: int = 0,
    reduce: Reduce = _no_reduce,
) -> Spectrum:
    """The top ``rank`` eigenpairs of ``graph``'s P~ (at most the number of items), the same on every
    run for the same graph, seed and thread count: a seeded Gaussian start, ``iterations`` applications of P~
    each followed by orthonormalisation, then the eigenpairs of P~ restricted to the subspace found."""
    norm, item_degree = normalised_graph(graph, reduce)
    num_items = graph.num_items
    rank = max(1, min(rank, num_items))
    width = min(num_items, rank + oversample)
    spectrum = Spectrum(
        norm=torch_csr(norm),
        norm_t=torch_csr(norm.T.tocsr()),
        item_degree=torch.from_numpy(item_degree),
        values=torch.zeros(0, dtype=torch.float64),
        vectors=torch.zeros(num_items, 0),
        reduce=reduce,
    )
    generator = torch.Generator().manual_seed(seed)
    estimate = fit_seconds(
        num_items, graph.num_users, graph.nnz, rank, oversample=oversample, iterations=iterations, t=host_throughput()
    )
    label = f"graph filter: eigensolver over {num_items:,} items, rank {rank}"
    with track(label, iterations + 2, unit="steps", estimate=estimate, done_line=False) as progress:
        basis = orthonormalise(torch.randn(num_items, width, generator=generator))
        progress.advance()
        for _ in range(iterations):
            basis = orthonormalise(spectrum.propagate_columns(basis))
            progress.advance()
        # Rayleigh-Ritz: P~ restricted to span(basis) is basis' P~ basis = (R~ basis)'(R~ basis), summed over users
        projected = spectrum.norm @ basis
        small = reduce(projected.t() @ projected).double()
        values, rotation = torch.linalg.eigh((small + small.t()) / 2)  # ascending
        order = torch.argsort(values, descending=True)[:rank]
        spectrum.values = values[order].clamp_min(0.0)
        spectrum.vectors = (basis @ rotation[:, order].to(basis.dtype)).contiguous()
        progress.advance()
    return spectrum
