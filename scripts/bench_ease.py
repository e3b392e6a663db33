"""The report's EASE path on a synthetic matrix: estimated vs measured peak memory, and its times.

$ python scripts/bench_ease.py --num-items 16000 --dtype float32
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from synthetic_matrix import synthetic_split, valid_sample  # scripts/: the matrix bench_ials.py times too

from recsys.rankers.ease.plan import GB, available_memory_bytes, ease_peak_bytes, plan_ease
from recsys.rankers.ease.solve import ease_from_gram, ease_topk, gram_dtype, gram_matrix
from recsys.ranking.metrics import compute_metrics


def _peak_rss_bytes(reset: bool = False) -> int:
    """This process's peak resident memory (Linux VmHWM); ``reset`` first sets it to the current RSS."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="The report's EASE path on a synthetic matrix: estimated vs measured peak memory, times."
    )
    parser.add_argument("--num-users", type=int, default=30_000)
    parser.add_argument("--num-items", type=int, default=8_000)
    parser.add_argument("--nnz", type=int, default=800_000)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--lam", type=float, default=100.0)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    train, valid = synthetic_split(args.num_users, args.num_items, args.nnz)
    estimate = ease_peak_bytes(train.num_items, dtype, num_users=train.num_users)
    plan = plan_ease(train.num_items, train.num_users, available_memory_bytes())
    print(f"{train.num_users:,} users x {train.num_items:,} items, {train.nnz:,} pairs; {args.dtype} peak estimate {estimate / GB:.2f} GB; "
          f"plan for the memory available now: {plan.describe()}", flush=True)  # fmt: skip
    base = _peak_rss_bytes(reset=True)
    start = time.perf_counter()
    gram = gram_matrix(train, dtype=gram_dtype(train.num_users, dtype))
    t_gram = time.perf_counter() - start
    history, relevant = valid_sample(train, valid, 10_000)  # one λ on a valid sample, as the stage scores one
    _, ids = ease_topk(ease_from_gram(gram, args.lam, dtype=dtype), history, 20, exclude=history)
    recall = compute_metrics(ids.numpy(), relevant, [20], num_items=train.num_items)["recall@20"]
    t_tune = time.perf_counter() - start - t_gram
    start = time.perf_counter()
    b = ease_from_gram(gram, args.lam, dtype=dtype, overwrite=True)
    del gram
    t_fit = time.perf_counter() - start
    start = time.perf_counter()
    ease_topk(b, train, 100, exclude=train)
    t_score = time.perf_counter() - start
    grown = _peak_rss_bytes() - base
    print(f"gram {t_gram:.1f} s; one λ (fit + up to 10,000 users scored) {t_tune:.1f} s; refit in G's memory {t_fit:.1f} s; "
          f"top-100 of all {train.num_users:,} users {t_score:.1f} s; peak RSS growth {grown / GB:.2f} GB "
          f"({grown / estimate:.2f} x the estimate); valid recall@20 {recall:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
