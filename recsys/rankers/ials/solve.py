"""iALS (Hu, Koren & Volinsky 2008, "Collaborative Filtering for Implicit Feedback Datasets"): the
matrix-factorisation baseline beside EASE in the report.

With X the binary user x item training matrix [U, I], user factors x_u [D] and item factors y_i [D]:

    min  Σ_u Σ_i c_ui (X_ui - x_uᵀ y_i)²  +  λ (Σ_u |x_u|² + Σ_i |y_i|²),   c_ui = α if X_ui = 1 else 1

fitted by alternating least squares with the ``implicit`` library (CPU, conjugate-gradient
updates; its ``alpha`` and ``regularization`` are α and λ above). Rendle et al. 2021 ("Revisiting
the Performance of iALS on Item Recommendation Benchmarks") show a tuned iALS is on par with EASE.

Protocol used in the report, the same as EASE's: fitted on the training interactions only; a
user's factors are re-solved from the split's history row (the items masked for the split: train
for valid, train and valid for test; exact least squares given the item factors, implicit's
``recalculate_user``), so test users' valid items count as history as they do for EASE and the
two-tower; scores <x_u, y_i> are ranked by ``exact_topk`` with the same masking and tie rule. λ and
α come from a small grid on valid (the evaluation stage, through ``IalsRanker``); D and the number of
iterations are fixed. The initial factors are drawn from ``seed``: reruns give the same numbers.

Cost: one fit is iterations x (nnz x D + (U + I) x D² x 3 CG steps); scoring is an [U, D] x [D, I]
matmul per split. On a synthetic 30,000-user x 41,000-item matrix (712,323 training pairs,
79,810 validation pairs), 2 cores shared with other jobs (load average ~6), one fit took 15 s and
the default 3 x 3 grid (D = 64, 15 iterations, 10,000 validation users) 161 s of wall time, 84 s
of CPU for the whole command (2026-11-30); the factors are (U + I) x D float32 = 18 MB:

    $ python scripts/bench_ials.py --num-users 30000 --num-items 41000 --nnz 800000
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk

DEFAULT_FACTORS = 64  # D: Rendle et al. 2021 gain little past 64-128 at these catalogue sizes
DEFAULT_ITERATIONS = 15  # ALS sweeps; implicit's default, where validation recall has levelled off
# Below this many training pairs implicit runs on one thread: its OpenMP workers wait on each other every
# half-sweep, which on a small fit costs more than the work it shares.
SINGLE_THREAD_PAIRS = 100_000


def _implicit_als():
    try:
        from implicit.cpu.als import AlternatingLeastSquares
    except ImportError as e:  # a declared dependency; a broken install is reported, not fatal
        raise ImportError(f"iALS needs the `implicit` package ({e}): pip install implicit") from e
    return AlternatingLeastSquares


@contextlib.contextmanager
def _one_blas_thread():
    """implicit runs its own threads over users / items; a multi-threaded BLAS inside each of them
    oversubscribes the cores (implicit warns about it), so BLAS is held to one thread meanwhile."""
    from threadpoolctl import threadpool_limits  # installed with implicit

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _scipy_csr(csr: UserItemCSR, values: float = 1.0):
    """``csr`` as a scipy float32 CSR matrix [num_users, I] holding ``values`` at every stored pair."""
    import scipy.sparse  # installed with implicit

    data = np.full(csr.nnz, values, dtype=np.float32)
    return scipy.sparse.csr_matrix((data, csr.indices, csr.indptr), shape=(csr.num_users, csr.num_items))


def fit_ials(
    train: UserItemCSR,
    *,
    regularization: float,
    alpha: float,
    factors: int = DEFAULT_FACTORS,
    iterations: int = DEFAULT_ITERATIONS,
    seed: int = 0,
    num_threads: int | None = None,
) -> Any:
    """implicit's ``AlternatingLeastSquares`` fitted on the binary ``train`` matrix.

    Args:
        train: [U rows, I items] CSR of training interactions (repeats already collapsed).
        regularization: λ > 0; alpha: α > 0 (see the module docstring).
        factors: D; iterations: ALS sweeps.
        seed: draws the initial factors (same seed, same factors).
        num_threads: implicit's worker threads; 0 = one per core; None = 1 below
            ``SINGLE_THREAD_PAIRS`` training pairs, else one per core.

    Returns:
        the fitted model: ``item_factors`` float32 [I, D], ``user_factors`` float32 [U, D].
    """
    if regularization <= 0 or alpha <= 0:
        raise ValueError(f"regularization and alpha must be > 0, got {regularization}, {alpha}")
    if num_threads is None:
        num_threads = 1 if train.nnz < SINGLE_THREAD_PAIRS else 0
    als = _implicit_als()  # imported first: a BLAS loaded inside the limit below would escape it
    with _one_blas_thread():  # around the constructor too, which checks the BLAS threads
        model = als(
            factors=factors, regularization=float(regularization), alpha=float(alpha), iterations=iterations,
            random_state=seed, num_threads=num_threads, dtype=np.float32,
        )  # fmt: skip
        model.fit(_scipy_csr(train), show_progress=False)
    return model


def ials_user_factors(model: Any, history: UserItemCSR) -> np.ndarray:
    """float32 [U, D]: each row of ``history`` [U rows, I] solved for exactly, given the item factors."""
    if history.num_items != model.item_factors.shape[0]:
        raise ValueError(f"history has {history.num_items} items, the model {model.item_factors.shape[0]}")
    if history.num_users == 0:
        return np.zeros((0, model.factors), dtype=np.float32)
    with _one_blas_thread():
        return np.asarray(model.recalculate_user(np.arange(history.num_users), _scipy_csr(history)), dtype=np.float32)


def ials_topk(
    model: Any,
    history: UserItemCSR,
    k: int,
    *,
    exclude: UserItemCSR | None = None,
    chunk_size: int = 4096,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k items per row of ``history`` by <x_u, y_i>, x_u re-solved from that row.

    Args:
        model: from ``fit_ials``.
        history: [U rows, I] CSR; row u is the input of user u.
        k, exclude, chunk_size: as in ``exact_topk`` (usually exclude is history itself).

    Returns:
        scores float32 [U, k], ids int64 [U, k], as in ``exact_topk``.
    """
    users = torch.from_numpy(ials_user_factors(model, history)).to(device)
    items = torch.from_numpy(np.asarray(model.item_factors, dtype=np.float32)).to(device)
    return exact_topk(users, items, k, exclude=exclude, chunk_size=chunk_size)
