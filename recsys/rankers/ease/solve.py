"""EASE (Steck 2019, "Embarrassingly Shallow Autoencoders for Sparse Data"): the strong linear baseline.

With X the binary user x item training matrix [U, I] and G = XᵀX (item co-occurrence counts):

    P = (G + λI)⁻¹,      B = I - P · diagMat(1 / diag(P))      (so diag(B) = 0, B_ij = -P_ij / P_jj)

A user's scores are ``x_u B`` where x_u [I] is the binary vector of the items they have seen; they
are ranked by ``chunked_topk`` with the same masking and tie rule as the two-tower.

Protocol used in the report: B is fitted on the training interactions only (what the two-tower
learns from); a user's history row is the items masked for the split (train for valid, train and
valid for test), the same items the two-tower's query sees. λ is the value of a log-spaced grid
with the best validation Recall@20 (the evaluation stage, through ``EaseRanker``).

Cost: G is [I, I] (4 I² bytes in float32) and the inverse O(I³) flops.
Scoring costs nnz(history) x I per split.

Memory: G is kept in float32 (co-occurrence counts are integers, exact below 2**24 users) and the
inverse is computed in place in one more [I, I] matrix A of the chosen dtype (Cholesky factor, then
its inverse, then B, all in A's memory), so the λ sweep holds G + A, plus B's float32 copy for
scoring when A is float64, and never one B per λ (the report keeps the best B so far, one more
float32 matrix, only when that fits too: it saves refitting it). ``plan_ease`` estimates that peak
(``ease_peak_bytes``) before anything is allocated and picks float64 when it fits in the memory
available, else float32, else skips; the estimate against measured peaks, and what a 24 GB host runs at
tens of thousands of items: docs/evaluation.md. Time is O(I³) per λ. The memory and time plan: recsys/rankers/ease/plan.py; the
benchmark of both against a synthetic matrix: scripts/bench_ease.py.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import chunked_topk

MAX_EASE_ITEMS = 50_000  # a cap on top of the memory plan: B alone is 50k² float32 = 10 GB and the inverse O(I³)
# Below this density a history chunk is multiplied as a sparse CSR matrix (nnz x I work), above
# it as a dense one (C x I x I): on CPU torch's sparse mm runs ~30x below dense GEMM throughput.
SPARSE_DENSITY = 0.02
GRAM_BLOCK = 2048  # item columns of X made dense at once by ``gram_matrix`` ([U, 2048] float32)


@contextlib.contextmanager
def _quiet_sparse():
    """Silences torch's one-off "Sparse CSR tensor support is in beta" warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        yield


def _csr_tensor(csr: UserItemCSR, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Rows ``start:stop`` of ``csr`` as a float32 sparse CSR tensor [stop - start, I] of ones."""
    lo, hi = int(csr.indptr[start]), int(csr.indptr[stop])
    crow = torch.from_numpy(csr.indptr[start : stop + 1] - lo)
    col = torch.from_numpy(csr.indices[lo:hi])
    values = torch.ones(hi - lo, dtype=torch.float32)
    with _quiet_sparse():
        return torch.sparse_csr_tensor(crow, col, values, (stop - start, csr.num_items), check_invariants=False).to(
            device
        )


def gram_matrix(
    train: UserItemCSR,
    *,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    block: int = GRAM_BLOCK,
) -> torch.Tensor:
    """G = XᵀX for the binary matrix X of ``train`` [U rows, I items]; dense [I, I] of ``dtype``.

    Computed as sparse(Xᵀ) @ dense(X[:, cols]) for blocks of ``block`` item columns: nnz x I work,
    and never a dense U x I matrix.
    """
    device = torch.device(device)
    num_items = train.num_items
    users = torch.from_numpy(train.row_user_ids())
    items = torch.from_numpy(train.indices)
    with _quiet_sparse():
        xt = (
            torch.sparse_coo_tensor(
                torch.stack([items, users]),
                torch.ones(train.nnz, dtype=torch.float32),
                (num_items, train.num_users),
                check_invariants=False,
            )
            .coalesce()
            .to_sparse_csr()
            .to(device)
        )  # [I, U]
    gram = torch.zeros(num_items, num_items, dtype=dtype, device=device)
    order = np.argsort(train.indices, kind="stable")  # the pairs in column (item) order
    items_sorted = train.indices[order]
    users_sorted = train.row_user_ids()[order]
    for lo in range(0, num_items, block):
        hi = min(lo + block, num_items)
        a, b = np.searchsorted(items_sorted, [lo, hi])
        cols = torch.zeros(train.num_users, hi - lo, dtype=torch.float32, device=device)  # X[:, lo:hi]
        cols[torch.from_numpy(users_sorted[a:b]).to(device), torch.from_numpy(items_sorted[a:b] - lo).to(device)] = 1.0
        gram[:, lo:hi] = torch.sparse.mm(xt, cols).to(dtype)  # counts < 2**24 are exact in float32
    return gram


def ease_from_gram(
    gram: torch.Tensor, lam: float, *, dtype: torch.dtype | None = None, overwrite: bool = False
) -> torch.Tensor:
    """B [I, I] (float32, diag 0) from G [I, I]: B = I - P diagMat(1/diag(P)), P = (G + λI)⁻¹.

    G + λI is symmetric positive definite for λ > 0, so P comes from its Cholesky factor. Both are
    computed in place in one [I, I] matrix A of ``dtype`` (G's dtype when None): peak memory is
    G + A (+ B's float32 copy when A is float64; A is freed before returning).

    Args:
        gram: G from ``gram_matrix`` (any float dtype; not modified unless ``overwrite``).
        lam: L2 weight λ > 0.
        dtype: precision of the factorisation (float64 as in Steck's code, or float32).
        overwrite: factor in G's own memory when it already has ``dtype`` (G is destroyed): the
            last fit after a λ sweep needs no second [I, I] matrix.
    """
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    dtype = gram.dtype if dtype is None else dtype
    a = gram if overwrite and gram.dtype == dtype else gram.to(dtype, copy=True)
    a.diagonal().add_(lam)
    # A is symmetric, so its transpose view is the same matrix in the column-major layout LAPACK
    # works in: with out= that view, potrf and potri run in A's memory (a row-major out= makes
    # torch allocate a column-major temporary, one more [I, I] matrix).
    a_cm = a.mT
    _, info = torch.linalg.cholesky_ex(a_cm, out=(a_cm, torch.empty((), dtype=torch.int32, device=a.device)))
    if int(info) != 0:
        raise RuntimeError(
            f"EASE: G + λI is not positive definite in {dtype} (λ={lam}, leading minor {int(info)}); "
            "a larger λ or float64 fixes this"
        )
    torch.cholesky_inverse(a_cm, out=a_cm)
    p = a
    p.div_(-p.diagonal().clone())  # column j divided by -P_jj: B_ij = -P_ij / P_jj
    p.diagonal().zero_()
    return p if p.dtype == torch.float32 else p.to(torch.float32)


def fit_ease(
    train: UserItemCSR, lam: float, *, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """The EASE weight matrix B, float32 [I, I], diag 0, fitted on the binary ``train`` matrix.

    Args:
        train: [U rows, I items] CSR of training interactions (repeats already collapsed).
        lam: L2 weight λ > 0.
        dtype: precision of the inverse (float64 by default, as in Steck's code; float32 needs
            half the memory, see ``plan_ease``).
    """
    gram = gram_matrix(train, dtype=gram_dtype(train.num_users, dtype), device=device)
    return ease_from_gram(gram, lam, dtype=dtype, overwrite=True)


def gram_dtype(num_users: int, dtype: torch.dtype) -> torch.dtype:
    """float32 holds every count G_ij <= num_users exactly below 2**24 users; else ``dtype``."""
    return torch.float32 if num_users < 2**24 else dtype


def ease_topk(
    b: torch.Tensor,
    history: UserItemCSR,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k items per user by EASE scores ``x_u B``, with ``exact_topk``'s masking and tie rule.

    Args:
        b: float32 [I, I] from ``fit_ease`` (on the device to score on).
        history: [U rows, I items] CSR; row u is the binary input x_u of user u.
        k, exclude, chunk_size: as in ``exact_topk`` (usually exclude is history itself).

    Returns:
        scores float32 [U, k], ids int64 [U, k], as in ``exact_topk``.
    """
    if b.dim() != 2 or b.shape[0] != b.shape[1] or b.shape[0] != history.num_items:
        raise ValueError(f"b must be [I, I] with I = {history.num_items}, got {tuple(b.shape)}")
    b = b.to(torch.float32)
    device = b.device

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        rows = _csr_tensor(history, start, stop, device)
        nnz = int(history.indptr[stop] - history.indptr[start])
        if nnz <= SPARSE_DENSITY * (stop - start) * history.num_items:
            out.copy_(torch.sparse.mm(rows, b))
            return out
        return torch.mm(rows.to_dense(), b, out=out)

    return chunked_topk(
        score_chunk, history.num_users, history.num_items, k, exclude=exclude, chunk_size=chunk_size, device=device
    )
