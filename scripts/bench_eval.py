"""Benchmark exact full-corpus top-k (with seen items masked) against the bare chunked matmuls.

Random embeddings and a random exclusion CSR at MovieLens-20M scale by default
(138k users x 27k items); the last line printed is a JSON object.

    $ python scripts/bench_eval.py                      # ML-20M scale
    $ python scripts/bench_eval.py --num-users 20000    # quicker
    $ python scripts/bench_eval.py --num-users 20000 --ann   # + FAISS flat / IVF / HNSW vs exact
    $ python scripts/bench_eval.py --device cuda         # one GPU: masked and ranked on the device

On a GPU, exact_topk takes chunked_topk's device path (recsys/ranking/device_topk.py: the seen items masked
there, the k + 1 candidates by groups, no host sync a chunk); ``ratio_vs_matmul_whole_row_topk`` times the same
path with torch.topk over whole rows, side by side (its ids are checked equal).

Random Gaussian embeddings have no cluster structure, so ANN recall here is a lower bound of what
trained embeddings get; the latency figures are what the bench is for.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import torch

from recsys.ranking.device_topk import device_chunked_topk
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-users", type=int, default=138000, help="query rows (ML-20M has 138,493 users)")
    p.add_argument("--num-items", type=int, default=27000, help="candidate rows (ML-20M has 26,744 rated movies)")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension")
    p.add_argument("--k", type=int, default=100, help="top-k per user")
    p.add_argument("--chunk-size", type=int, default=4096, help="query rows per matmul")
    p.add_argument("--history-per-user", type=int, default=100, help="excluded (seen) items per user")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--ann", action="store_true", help="also time FAISS indexes and their recall vs exact")
    return p.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_matmuls(queries: torch.Tensor, items: torch.Tensor, chunk_size: int) -> float:
    """Seconds for the chunked score matmuls alone (the floor exact_topk is measured against).

    Written into one reused [chunk_size, I] buffer, as exact_topk does.
    """
    items_t = items.t()
    buffer = torch.empty(min(chunk_size, queries.shape[0]), items.shape[0], device=queries.device)
    _sync(queries.device)
    start = time.perf_counter()
    for lo in range(0, queries.shape[0], chunk_size):
        hi = min(lo + chunk_size, queries.shape[0])
        torch.mm(queries[lo:hi], items_t, out=buffer[: hi - lo])
    _sync(queries.device)
    return time.perf_counter() - start


def whole_row_topk(queries: torch.Tensor, items: torch.Tensor, args, exclude: UserItemCSR, ids: torch.Tensor) -> float:
    """Seconds of exact_topk's device path with its candidates taken by torch.topk over every whole row
    (``by_groups=False``) instead of over each row's best groups; its ids are checked equal to ``ids``."""
    items_t = items.t()

    def score_chunk(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        return torch.mm(queries[start:stop], items_t, out=out)

    def run():
        return device_chunked_topk(
            score_chunk, queries.shape[0], items.shape[0], args.k, exclude=exclude, chunk_size=args.chunk_size,
            device=queries.device, by_groups=False,
        )  # fmt: skip

    _sync(queries.device)
    start = time.perf_counter()
    _, rows_ids = run()
    _sync(queries.device)
    seconds = time.perf_counter() - start
    if not torch.equal(rows_ids, ids):
        raise SystemExit("bench_eval: the device path's ids differ between whole-row and by-group candidates")
    return seconds


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    queries = torch.randn(args.num_users, args.dim, generator=gen).to(device)
    items = torch.randn(args.num_items, args.dim, generator=gen).to(device)
    rng = np.random.default_rng(args.seed)
    history = min(args.history_per_user, args.num_items)
    exclude = UserItemCSR.from_pairs(
        np.repeat(np.arange(args.num_users), history),
        rng.integers(0, args.num_items, size=args.num_users * history),
        num_users=args.num_users,
        num_items=args.num_items,
    )
    print(
        f"users={args.num_users} items={args.num_items} dim={args.dim} k={args.k} "
        f"chunk_size={args.chunk_size} excluded_pairs={exclude.nnz} device={device} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )

    warm = min(args.chunk_size, args.num_users)  # first-call allocator / BLAS start-up, not timed
    bare_matmuls(queries[:warm], items, args.chunk_size)
    exact_topk(queries[:warm], items, args.k, exclude=exclude.select_rows(np.arange(warm)), chunk_size=args.chunk_size)

    t_matmul = bare_matmuls(queries, items, args.chunk_size)
    _sync(device)
    start = time.perf_counter()
    scores, ids = exact_topk(queries, items, args.k, exclude=exclude, chunk_size=args.chunk_size)
    _sync(device)
    t_topk = time.perf_counter() - start
    assert ids.shape == (args.num_users, args.k) and scores.dtype == torch.float32

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    result = {
        "users_per_s": round(args.num_users / t_topk, 1),
        "ratio_vs_matmul": round(t_topk / t_matmul, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
    }
    print(f"(a) bare chunked matmuls: {t_matmul:.3f} s ({args.num_users / t_matmul:,.0f} users/s)")
    print(f"(b) exact_topk + masking: {t_topk:.3f} s ({args.num_users / t_topk:,.0f} users/s)")
    print(f"ratio b/a: {t_topk / t_matmul:.2f}   peak RSS: {peak_rss_mb:,.0f} MB")
    if device.type != "cpu":  # the device path's candidates by torch.topk over whole rows, side by side
        t_rows = whole_row_topk(queries, items, args, exclude, ids)
        result["ratio_vs_matmul_whole_row_topk"] = round(t_rows / t_matmul, 3)
        print(f"(c) (b) with torch.topk over whole rows: {t_rows:.3f} s, ratio c/a {t_rows / t_matmul:.2f}")
    if device.type == "cuda":
        result["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    if args.ann:
        from recsys.evaluation.ann import compare_ann

        summary, _ = compare_ann(items.cpu(), queries.cpu(), args.k, exclude=exclude, chunk_size=args.chunk_size)
        for kind, entry in summary["indexes"].items():
            print(
                f"(ann) {kind:9s} recall vs exact {entry['recall_vs_exact']:.4f}  build {entry['build_s']:.2f} s  "
                f"{entry['users_per_s']:,.0f} users/s  single query {entry['single_query_ms']:.3f} ms"
            )
            result[f"ann_{kind}_recall"] = round(entry["recall_vs_exact"], 4)
            result[f"ann_{kind}_users_per_s"] = round(entry["users_per_s"], 1)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
