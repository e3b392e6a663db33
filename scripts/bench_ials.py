"""iALS's fit and the evaluation stage's default grid (eval.settings.ials: 3 x 3, 64 factors, 15 iterations) on a
synthetic matrix: one fit's time, each grid point's fit + scoring of a valid sample, the whole grid's time.

$ python scripts/bench_ials.py --num-users 30000 --num-items 41000 --nnz 800000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from synthetic_matrix import synthetic_split, valid_sample  # scripts/: the matrix bench_ease.py times too

from recsys.rankers.ials.settings import IalsSettings
from recsys.rankers.ials.solve import fit_ials, ials_topk
from recsys.ranking.metrics import compute_metrics


def main(argv: Sequence[str] | None = None) -> dict[tuple[float, float], float]:
    """Prints the figures; returns each grid point's (λ, α) valid recall@20."""
    parser = argparse.ArgumentParser(description="Times iALS's default grid on a synthetic matrix.")
    parser.add_argument("--num-users", type=int, default=30_000)
    parser.add_argument("--num-items", type=int, default=41_000)
    parser.add_argument("--nnz", type=int, default=800_000)
    parser.add_argument("--max-users", type=int, default=10_000, help="valid users scored per grid point")
    args = parser.parse_args(argv)
    settings = IalsSettings()  # the stage's defaults
    train, valid = synthetic_split(args.num_users, args.num_items, args.nnz)
    print(
        f"train: {train.num_users:,} users x {train.num_items:,} items, {train.nnz:,} pairs; valid {valid.nnz:,} pairs"
    )
    history, relevant = valid_sample(train, valid, args.max_users)
    recalls = {}
    start = time.perf_counter()
    for reg in settings.regularizations:
        for alpha in settings.alphas:
            point = time.perf_counter()
            model = fit_ials(
                train, regularization=reg, alpha=alpha, factors=settings.factors, iterations=settings.iterations
            )
            fit_s = time.perf_counter() - point
            _, ids = ials_topk(model, history, 20, exclude=history)
            recall = compute_metrics(ids.numpy(), relevant, [20], num_items=train.num_items)["recall@20"]
            recalls[(reg, alpha)] = recall
            print(f"  λ={reg:g} α={alpha:g}: fit {fit_s:.1f} s, valid recall@20 {recall:.4f}", flush=True)
    print(
        f"grid of {len(settings.regularizations) * len(settings.alphas)} in {time.perf_counter() - start:.1f} s on "
        f"{history.num_users:,} valid users, {torch.get_num_threads()} torch threads"
    )
    return recalls


if __name__ == "__main__":
    main()
