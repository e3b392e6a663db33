"""What the servable graph filter costs as the catalogue grows: the spectrum's fit (time, peak memory), the
bundle's vectors, and one query's encoding and exact search, on a synthetic power-law graph.

The shipped path (recsys/rankers/graph_filter/ranker.py, spectral.py): the fit applies P~ = R~'R~ to [I, rank +
oversample] blocks (no [users, items] array, no item-item matrix), the bundle holds item vectors and a query
table of [I, rank + low_rank] floats, and a query is a sum over the user's items plus an inner-product search.
Each catalogue size runs in a fresh process (its peak RSS is its own); the last line printed is a JSON object.

    $ python scripts/bench_graph_filter.py                          # 10^5 items (and 10^4 for the ratio)
    $ python scripts/bench_graph_filter.py --items 100000,1000000 --rank 256
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", default="10000,100000", help="catalogue sizes, comma-separated")
    p.add_argument("--users-per-item", type=float, default=0.75, help="users = this x items (Gowalla: 0.73)")
    p.add_argument("--per-user", type=int, default=27, help="interactions per user (Gowalla's train: 27 on average)")
    p.add_argument("--rank", type=int, default=1024, help="eval.settings.graph_filter.rank")
    p.add_argument("--low-rank", type=int, default=256, help="eval.settings.graph_filter.low_rank")
    p.add_argument("--iterations", type=int, default=3, help="eval.settings.graph_filter.iterations")
    p.add_argument("--oversample", type=int, default=64, help="eval.settings.graph_filter.oversample")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> dict:
    import resource
    import time

    import numpy as np
    import torch

    from recsys.evaluation.ann import ann_topk, build_index
    from recsys.rankers.graph_filter.ranker import GraphFilterVectors
    from recsys.rankers.graph_filter.spectral import fit_spectrum
    from recsys.ranking.interactions import UserItemCSR

    torch.set_num_threads(args.threads)
    num_items = args.child
    num_users = int(args.users_per_item * num_items)
    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, num_items + 1) ** 0.8  # a power law, as real catalogues
    users = np.repeat(np.arange(num_users), args.per_user)
    items = rng.choice(num_items, size=users.size, p=popularity / popularity.sum())
    graph = UserItemCSR.from_pairs(users, items, num_users=num_users, num_items=num_items)
    del users, items
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    spectrum = fit_spectrum(graph, args.rank, iterations=args.iterations, oversample=args.oversample)
    vectors = GraphFilterVectors.of(spectrum, args.low_rank)
    table, item_vectors = vectors.query_table(0.1), vectors.item_vectors(2.5)
    fit_s = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    start = time.perf_counter()
    index = build_index(item_vectors, "flat")
    index_s = time.perf_counter() - start
    history = graph.row(0)
    start = time.perf_counter()
    for _ in range(10):
        query = table[torch.from_numpy(history)].sum(dim=0, keepdim=True)
        ann_topk(index, query, 20)
    query_ms = (time.perf_counter() - start) / 10 * 1e3
    return {
        "items": num_items,
        "users": num_users,
        "interactions": int(graph.nnz),
        "rank": spectrum.rank,
        "fit_s": round(fit_s, 1),
        "fit_peak_rss_gb": round(peak_gb, 2),
        "rss_before_fit_gb": round(before / 2**20, 2),
        "bundle_vectors_gb": round((table.numel() + item_vectors.numel()) * 4 / 2**30, 3),
        "flat_index_build_s": round(index_s, 2),
        "one_query_exact_search_ms": round(query_ms, 1),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return []
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child", str(items)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['items']:>9,} items, {r['users']:>9,} users, {r['interactions']:>11,} interactions: fit {r['fit_s']:>7.1f} s, "
            f"peak RSS {r['fit_peak_rss_gb']:.2f} GB, bundle vectors {r['bundle_vectors_gb']:.3f} GB, "
            f"one query {r['one_query_exact_search_ms']:.1f} ms (flat index)",
            flush=True,
        )
    for a, b in zip(rows, rows[1:]):
        growth = b["items"] / a["items"]
        print(
            f"x{growth:g} items: fit x{b['fit_s'] / max(a['fit_s'], 1e-9):.1f}, peak RSS x"
            f"{b['fit_peak_rss_gb'] / max(a['fit_peak_rss_gb'], 1e-9):.1f}, vectors x{b['bundle_vectors_gb'] / max(a['bundle_vectors_gb'], 1e-9):.1f}"
        )
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
