"""EASE served in a fusion with a 64-d two-tower part, as the bundle holds and ranks it, by catalogue size: the bundle's
bytes for the EASE part and its covariance, the time to build the served ranker (the covariance), and the time to
encode and score a batch of queries, side by side with the 64-d part alone (the ratio is the cost EASE adds).

$ python scripts/bench_ease_served.py --items 2048,4096,8192 --batch 1024
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from recsys.rankers.ease.part import EasePart
from recsys.rankers.parts import Catalogue, Query
from recsys.rankers.served import Served
from recsys.rankers.two_tower.part import TwoTowerPart


class _Fixed(TwoTowerPart):
    """A 64-d part whose query vectors are given (the two-tower's encoder is not what is measured here)."""

    def __init__(self, items: torch.Tensor, queries: torch.Tensor) -> None:
        super().__init__(items)
        self.queries = queries

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        return self.queries


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure(num_items: int, batch: int, history: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    catalogue = Catalogue(batch, num_items, np.zeros(num_items + 1, np.int64), np.zeros(0, np.int64))
    query = Query(None, np.full(batch, history), rng.integers(0, num_items, batch * history))
    tower = _Fixed(torch.randn(num_items, 64, generator=g), torch.randn(batch, 64, generator=g))
    ease = EasePart(torch.randn(num_items, num_items, generator=g) / num_items)
    start = time.perf_counter()
    fused = Served([tower, ease], [1.0, 0.5])  # computes the parts' item covariances
    build_s = time.perf_counter() - start
    alone = Served([tower], [1.0])
    with tempfile.TemporaryDirectory() as tmp:
        fused.save(Path(tmp))
        size = _bytes(Path(tmp))

    def seconds(served: Served) -> float:
        items_t = served.items().t()
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            torch.topk(served.encode(query, catalogue) @ items_t, 20, dim=1)
            best = min(best, time.perf_counter() - start)
        return best

    fused_s, alone_s = seconds(fused), seconds(alone)
    return {
        "items": num_items,
        "bundle_gib": size / 2**30,
        "build_s": build_s,
        "fused_ms_per_query": 1e3 * fused_s / batch,
        "two_tower_ms_per_query": 1e3 * alone_s / batch,
        "ratio": fused_s / alone_s,
    }


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default="2048,4096,8192", help="catalogue sizes, comma-separated")
    parser.add_argument("--batch", type=int, default=1024, help="queries encoded and scored at once")
    parser.add_argument("--history", type=int, default=50, help="items in each query's history")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (the best is kept)")
    args = parser.parse_args(argv)
    print(f"torch threads {torch.get_num_threads()}; batch {args.batch}, history {args.history}")
    print(f"{'items':>7} {'bundle GiB':>10} {'build s':>8} {'fused ms/q':>10} {'2-tower ms/q':>12} {'ratio':>7}")
    rows = []
    for n in (int(v) for v in args.items.split(",")):
        r = measure(n, args.batch, args.history, args.rounds)
        rows.append(r)
        print(
            f"{r['items']:>7} {r['bundle_gib']:>10.3f} {r['build_s']:>8.1f} {r['fused_ms_per_query']:>10.3f} "
            f"{r['two_tower_ms_per_query']:>12.4f} {r['ratio']:>7.1f}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
