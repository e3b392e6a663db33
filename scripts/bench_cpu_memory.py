"""What the entry points' CPU allocator settings (recsys/utils/cpu_memory.py) buy: the evaluation's big blocks,
timed in two fresh processes, one with glibc's and torch's defaults and one as ``python -m recsys.train`` sets them.

A random interaction graph at Gowalla's scale by default (29,858 users x 40,981 items, 27 per user); per
block of 4096 users: the two-tower's score matmul and its top-k (seen items masked), and the graph filter's
score block (recsys/rankers/graph_filter/ranker.py: the users' pooled history through the top of the spectrum, then
against every item). The last line printed is a JSON object.

    $ python scripts/bench_cpu_memory.py
    $ python scripts/bench_cpu_memory.py --blocks 2    # quicker

Training's share is measured by the training itself (its log's samples/s; docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-users", type=int, default=29858, help="graph rows (Gowalla: 29,858)")
    p.add_argument("--num-items", type=int, default=40981, help="graph columns, scored items (Gowalla: 40,981)")
    p.add_argument("--per-user", type=int, default=27, help="interactions per user (Gowalla's train: 24 on average)")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension of the score matmul")
    p.add_argument("--chunk-size", type=int, default=4096, help="users per block (eval.chunk_size)")
    p.add_argument("--blocks", type=int, default=4, help="blocks timed per process")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--rank",
        type=int,
        default=256,
        help="eigenpairs of the graph filter's spectrum (eval.settings.graph_filter.rank)",
    )
    p.add_argument("--child", choices=["default", "tuned"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> dict:
    """Runs in a fresh process: the allocator must be set before torch is imported."""
    applied = []
    if args.child == "tuned":
        from recsys.utils.cpu_memory import tune_cpu_allocator

        applied = tune_cpu_allocator()
    import resource
    import time

    import numpy as np
    import torch

    from recsys.rankers.base import EvalSplit
    from recsys.rankers.graph_filter.ranker import GraphFilterFit, GraphFilterVectors
    from recsys.rankers.graph_filter.spectral import fit_spectrum
    from recsys.ranking.interactions import UserItemCSR
    from recsys.ranking.retrieval import exact_topk

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(args.num_users), args.per_user)
    graph = UserItemCSR.from_pairs(
        users, rng.integers(0, args.num_items, users.size), num_users=args.num_users, num_items=args.num_items
    )
    spectrum = fit_spectrum(graph, args.rank, iterations=1, oversample=0)  # its accuracy is not what is timed
    gf = GraphFilterFit(GraphFilterVectors.of(spectrum, min(args.rank, 256)), 0.0)
    queries = torch.randn(args.chunk_size, args.dim)
    items = torch.randn(args.num_items, args.dim)
    block = graph.select_rows(np.arange(args.chunk_size))
    split = EvalSplit("valid", np.arange(args.chunk_size), block, graph, block, ("train",))
    point = [{"alpha": 0.1, "sharpen": 2.5}]

    def timed(fn) -> float:
        fn()  # warm-up: the first block pays for what any allocator must map once
        start = time.perf_counter()
        for _ in range(args.blocks):
            fn()
        return (time.perf_counter() - start) / args.blocks

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = {
        "score_block_topk": timed(lambda: exact_topk(queries, items, 50, exclude=block)),
        "graph_filter_block": timed(lambda: list(gf.score_blocks(split, 0, args.chunk_size, point))),
    }
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"applied": applied, "seconds_per_block": seconds, "page_faults": faults}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    runs = {}
    for mode in ("default", "tuned"):
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child", mode]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.num_users} users x {args.num_items} items, blocks of {args.chunk_size}, {args.threads} threads")
    print(f"tuned: {runs['tuned']['applied']}")
    for what in runs["default"]["seconds_per_block"]:
        before, after = runs["default"]["seconds_per_block"][what], runs["tuned"]["seconds_per_block"][what]
        print(f"{what:>20}: {before:.3f} s -> {after:.3f} s per block ({before / after:.2f}x)")
    print(f"{'page faults':>20}: {runs['default']['page_faults']:,} -> {runs['tuned']['page_faults']:,}")
    print(json.dumps(runs))
    return runs


if __name__ == "__main__":
    main()
