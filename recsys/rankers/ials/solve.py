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
α come from a small grid by validation Recall@20 (``tune_ials``); D and the number of iterations
are fixed. The initial factors are drawn from ``seed``: reruns give the same numbers.

Cost: one fit is iterations x (nnz x D + (U + I) x D² x 3 CG steps); scoring is an [U, D] x [D, I]
matmul per split. On a synthetic 30,000-user x 41,000-item matrix (712,323 training pairs,
79,810 validation pairs), 2 cores shared with other jobs (load average ~6), one fit took 15 s and
the default 3 x 3 grid (D = 64, 15 iterations, 10,000 validation users) 161 s of wall time, 84 s
of CPU for the whole command (2026-11-30); the factors are (U + I) x D float32 = 18 MB:

    $ python -m recsys.rankers.ials.solve --num-users 30000 --num-items 41000 --nnz 800000
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import compute_metrics
from recsys.ranking.retrieval import exact_topk

DEFAULT_FACTORS = 64  # D: Rendle et al. 2021 gain little past 64-128 at these catalogue sizes
DEFAULT_ITERATIONS = 15  # ALS sweeps; implicit's default, where validation recall has levelled off
DEFAULT_REGULARIZATIONS = (0.1, 1.0, 10.0)  # λ, decade steps
DEFAULT_ALPHAS = (3.0, 10.0, 30.0)  # α: weight of a seen item against 1 for an unseen one, half-decade steps
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


@dataclass
class IalsTuning:
    """Result of ``tune_ials``: the chosen (λ, α), the validation metric of every grid point, the model."""

    best_regularization: float
    best_alpha: float
    metric: str
    scores: dict[tuple[float, float], float] = field(default_factory=dict)  # (λ, α) -> validation metric
    num_users: int = 0  # validation users the metric was measured on
    factors: int = DEFAULT_FACTORS
    iterations: int = DEFAULT_ITERATIONS
    seconds: float = 0.0  # wall time of the whole grid (fits and scoring)
    model: Any = None  # the fitted model of the best grid point (no refit needed)


def tune_ials(
    train: UserItemCSR,
    history: UserItemCSR,
    relevant: UserItemCSR,
    *,
    exclude: UserItemCSR | None = None,
    regularizations: Sequence[float] = DEFAULT_REGULARIZATIONS,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    factors: int = DEFAULT_FACTORS,
    iterations: int = DEFAULT_ITERATIONS,
    k: int = 20,
    max_users: int | None = 10_000,
    seed: int = 0,
    chunk_size: int = 4096,
    device: str | torch.device = "cpu",
) -> IalsTuning:
    """Picks (λ, α) by validation Recall@k: fit on ``train`` for each grid point, rank, score.

    Args:
        train: [all users, I] training CSR the factors are fitted on.
        history / relevant / exclude: [V rows] CSRs of the validation users: input rows, held-out
            items, masked items (exclude defaults to history).
        regularizations, alphas: the grid (their product); ties on the metric go to the earlier
            point, λ-major order.
        max_users: score at most this many validation users, a seeded uniform sample (the one
            ``tune_ease`` draws with the same seed); None scores all.
        seed: the user sample and every fit's initial factors.

    Returns:
        ``IalsTuning`` with ``scores[(λ, α)] = recall@k`` on the (sampled) validation users and the
        best point's model.
    """
    grid = [(float(reg), float(alpha)) for reg in regularizations for alpha in alphas]
    if not grid:
        raise ValueError("regularizations and alphas must not be empty")
    start = time.perf_counter()
    exclude = history if exclude is None else exclude
    rows = np.arange(history.num_users)
    if max_users is not None and history.num_users > max_users:
        rows = np.sort(np.random.default_rng(seed).choice(history.num_users, size=max_users, replace=False))
        history, relevant, exclude = (c.select_rows(rows) for c in (history, relevant, exclude))
    metric = f"recall@{k}"
    scores: dict[tuple[float, float], float] = {}
    best, best_model = None, None
    for reg, alpha in grid:
        model = fit_ials(train, regularization=reg, alpha=alpha, factors=factors, iterations=iterations, seed=seed)
        _, ids = ials_topk(model, history, k, exclude=exclude, chunk_size=chunk_size, device=device)
        scores[(reg, alpha)] = compute_metrics(ids.cpu().numpy(), relevant, [k], num_items=train.num_items)[metric]
        value = np.nan_to_num(scores[(reg, alpha)], nan=-1.0)
        if best is None or value > best:  # strictly better: ties keep the earlier point
            best, best_point, best_model = value, (reg, alpha), model
    return IalsTuning(
        best_regularization=best_point[0], best_alpha=best_point[1], metric=metric, scores=scores,
        num_users=int(rows.shape[0]), factors=factors, iterations=iterations,
        seconds=time.perf_counter() - start, model=best_model,
    )  # fmt: skip


# ------------------------------------------------------------------------------- benchmark


def synthetic_split(
    num_users: int, num_items: int, nnz: int, *, holdout: float = 0.1, seed: int = 0
) -> tuple[UserItemCSR, UserItemCSR]:
    """A (train, valid) pair of the given size for timing: users with a lognormal number of items
    drawn from a Zipf-like popularity (exponent 0.8), ``holdout`` of each user's pairs held out.
    Repeats are collapsed, so the pair count comes out a little under ``nnz``."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(0.0, 1.0, num_users)
    lengths = np.maximum(1, np.round(lengths * nnz / lengths.sum())).astype(np.int64)
    pop = 1.0 / (np.arange(num_items) + 10.0) ** 0.8
    users = np.repeat(np.arange(num_users), lengths)
    items = rng.permutation(num_items)[rng.choice(num_items, size=users.shape[0], p=pop / pop.sum())]
    held = rng.random(users.shape[0]) < holdout
    train = UserItemCSR.from_pairs(users[~held], items[~held], num_users=num_users, num_items=num_items)
    valid = UserItemCSR.from_pairs(users[held], items[held], num_users=num_users, num_items=num_items)
    return train, valid


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Times tune_ials (the report's default grid) on a synthetic matrix.")
    parser.add_argument("--num-users", type=int, default=30_000)
    parser.add_argument("--num-items", type=int, default=41_000)
    parser.add_argument("--nnz", type=int, default=800_000)
    parser.add_argument("--max-users", type=int, default=10_000)
    args = parser.parse_args(argv)
    train, valid = synthetic_split(args.num_users, args.num_items, args.nnz)
    print(
        f"train: {train.num_users:,} users x {train.num_items:,} items, {train.nnz:,} pairs; valid {valid.nnz:,} pairs"
    )
    start = time.perf_counter()
    fit_ials(train, regularization=1.0, alpha=10.0)
    print(f"one fit: {time.perf_counter() - start:.1f} s")
    tuning = tune_ials(train, train, valid, max_users=args.max_users)
    for (reg, alpha), value in tuning.scores.items():
        print(f"  λ={reg:g} α={alpha:g}: {tuning.metric} {value:.4f}")
    print(
        f"best λ={tuning.best_regularization:g} α={tuning.best_alpha:g}; grid of {len(tuning.scores)} in {tuning.seconds:.1f} s "
        f"on {tuning.num_users:,} validation users, {torch.get_num_threads()} torch threads"
    )


if __name__ == "__main__":
    main()
