"""Memory of one rank's training data: the whole dataset (default) vs. its own users only (data.shard_by_user).

    $ .venv/bin/python scripts/bench_shard_memory.py                         # 10M interactions, 4 ranks
    $ .venv/bin/python scripts/bench_shard_memory.py --interactions 2000000 --world-size 8

Prepares (once, cached under ``--data``) a synthetic dataset of ``--interactions`` rows, then in a
fresh process each (so each peak RSS is its own) builds what a trainer rank holds before its
first step: the loaded splits, the items' categories, and ``TrainBatches`` with its first batch.

1. ``baseline``: the imports only (torch, torchrec, pyarrow: the floor every rank pays);
2. ``whole``: ``load_dataset(dir)``, what every rank holds by default;
3. ``rank r of W``: ``load_dataset(dir, user_range)`` for the users ``user_boundaries`` gives
   rank r, as with ``data.shard_by_user=true`` (the item counts are summed over ranks in a real
   job; here the one rank's own, which costs the same memory).

Figures are peak RSS (VmHWM) minus the baseline's. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: per address space, so a fresh exec starts from zero;
    ru_maxrss would carry the parent's peak over)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(dataset_dir: str, world_size: int, rank: int, history_length: int) -> None:
    """Runs in a fresh process; prints peak RSS in MiB."""
    import numpy as np  # noqa: PLC0415

    from recsys.data.batches import TrainBatches  # noqa: PLC0415
    from recsys.data.dataset import load_dataset  # noqa: PLC0415
    from recsys.distributed.rank_data import user_range  # noqa: PLC0415

    if world_size > 0:
        if world_size == 1:
            data, counts = load_dataset(dataset_dir), None
        else:
            data = load_dataset(dataset_dir, user_range(dataset_dir, rank, world_size))
            data = type(data)(
                **{
                    **data.__dict__,
                    "global_item_counts": np.bincount(data.splits["train"].item_ids, minlength=data.num_items),
                }
            )
            n = len(data.splits["train"])
            counts = [n] * world_size  # the real counts differ by a few rows; the memory does not
        batches = TrainBatches(
            data,
            history_length=history_length,
            global_batch_size=1024 * max(1, world_size),
            num_negatives=0,
            seed=0,
            rank=rank,
            world_size=max(1, world_size),
            prefetch=0,
            rank_example_counts=counts,
        )
        next(batches.epoch(0))
        rows = sum(len(s) for s in data.splits.values())
        print(json.dumps({"rows": rows, "peak_mb": peak_rss_mb()}))
    else:
        print(json.dumps({"rows": 0, "peak_mb": peak_rss_mb()}))


def run_child(dataset_dir: str, world_size: int, rank: int, history_length: int) -> dict:
    cmd = [sys.executable, __file__, "--child", dataset_dir, str(world_size), str(rank), str(history_length)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interactions", type=int, default=10_000_000)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--history-length", type=int, default=20)
    p.add_argument(
        "--data", default="/tmp/recsys-bench-shards", help="where the synthetic dataset is prepared (cached)"
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import dataclasses  # noqa: PLC0415

    from data_pipelines.synthetic import DEFAULT_SPEC, prepare_synthetic  # noqa: PLC0415

    scale = args.interactions / DEFAULT_SPEC.num_interactions
    spec = dataclasses.replace(
        DEFAULT_SPEC, num_interactions=args.interactions, num_users=max(100, int(DEFAULT_SPEC.num_users * scale))
    )
    dataset_dir = str(prepare_synthetic(spec, protocol="recbole", split_seed=0, root=args.data))
    print(
        f"dataset {dataset_dir}: {args.interactions:,} interactions, {spec.num_users:,} users, {spec.num_items:,} items",
        flush=True,
    )

    base = run_child(dataset_dir, 0, 0, args.history_length)["peak_mb"]
    whole = run_child(dataset_dir, 1, 0, args.history_length)
    ranks = [run_child(dataset_dir, args.world_size, r, args.history_length) for r in range(args.world_size)]
    whole_mb = whole["peak_mb"] - base
    rank_mb = max(r["peak_mb"] for r in ranks) - base
    print(f"baseline (imports): {base:,.0f} MB peak RSS")
    print(f"whole dataset on one rank: +{whole_mb:,.0f} MB ({whole['rows']:,} rows)")
    for r, info in enumerate(ranks):
        print(
            f"rank {r} of {args.world_size}, own users only: +{info['peak_mb'] - base:,.0f} MB ({info['rows']:,} rows)"
        )
    result = {
        "interactions": args.interactions,
        "world_size": args.world_size,
        "baseline_mb": round(base, 1),
        "whole_mb": round(whole_mb, 1),
        "max_rank_mb": round(rank_mb, 1),
        "ratio_whole_vs_rank": round(whole_mb / rank_mb, 2) if rank_mb > 0 else None,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
