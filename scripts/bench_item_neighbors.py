"""The candidates' co-occurrence neighbours (``data.item_neighbors``) of a prepared dataset: their time, and the
same lists with each long row's sort cut to its contenders against a sort of every co-occurrence.

    $ .venv/bin/python scripts/bench_item_neighbors.py data/gowalla-given-3ddb02e3eb42cf01
    $ .venv/bin/python scripts/bench_item_neighbors.py data/synthetic-f580a6b9860dd116 --k 20 --rounds 3

The dataset dir is the one a run logs at its start ("dataset <dir>: ..."). Each round times
``recsys.data.neighbors.item_neighbors`` on its training split twice, in alternating order: as it runs (a long
row sorts only the entries at or above a floor sampled from it, ``_score_floors``) and with every floor at
-inf (every co-occurrence sorted: the code before 2026-12-03). It checks the two give the same lists, to the
last id, and prints the median seconds of each and their ratio. The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from unittest import mock

import numpy as np

from recsys.data import neighbors
from recsys.data.dataset import load_dataset


def no_floors(rows: np.ndarray, scores: np.ndarray, num_rows: int, k: int) -> np.ndarray:
    return np.full(num_rows, -np.inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a prepared dataset dir (data/<name>-<hash>)")
    parser.add_argument("--k", type=int, default=20, help="neighbours per item (data.item_neighbors)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    data = load_dataset(args.dataset)
    train = data.splits["train"]

    def timed(full_sort: bool) -> tuple[float, tuple[np.ndarray, np.ndarray]]:
        with mock.patch.object(neighbors, "_score_floors", no_floors) if full_sort else contextlib.nullcontext():
            start = time.perf_counter()
            lists = neighbors.item_neighbors(train, data.num_users, data.num_items, args.k)
            return time.perf_counter() - start, lists

    seconds: dict[str, list[float]] = {"floors": [], "full_sort": []}
    for r in range(args.rounds):
        order = ["floors", "full_sort"] if r % 2 == 0 else ["full_sort", "floors"]
        lists = {}
        for name in order:
            s, lists[name] = timed(name == "full_sort")
            seconds[name].append(s)
        same = all(np.array_equal(a, b) for a, b in zip(lists["floors"], lists["full_sort"]))
        if not same:
            raise SystemExit("the two ways gave different neighbour lists")
    result = {
        "dataset": args.dataset,
        "users": data.num_users,
        "items": data.num_items,
        "train_interactions": len(train),
        "k": args.k,
        "floors_s": round(statistics.median(seconds["floors"]), 2),
        "full_sort_s": round(statistics.median(seconds["full_sort"]), 2),
        "same_lists": True,
    }
    result["ratio"] = round(result["floors_s"] / result["full_sort_s"], 3)
    print(
        f"{data.num_users} users x {data.num_items} items, {len(train)} training rows, k={args.k}: "
        f"{result['floors_s']} s with the sampled floors, {result['full_sort_s']} s sorting every co-occurrence "
        f"({result['ratio']}x), the same lists"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
