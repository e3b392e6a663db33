"""Continuous training, measured (docs/continuous-training.md): a churning log replayed as daily slices, and the
managed tables' memory as the id space grows.

1. ``replay``: +experiment=daily (the synthetic log with item churn, 8 time slices). For every slice k = 0..6, four
   runs, each tested on slice k + 1 (Recall@20 over every catalogue item, seen items masked):

       managed incremental   model.id_mapping=managed, slice k alone, warm-started from slice k - 1's run
       managed scratch       model.id_mapping=managed, slices 0..k, from scratch (data.slice_window=0)
       vocab incremental     model.id_mapping=vocab (a row per id of the whole log's vocabulary, which a real
       vocab scratch         pipeline would not know in advance: "where it applies"), the same two ways

   printing each run's next-slice Recall@20, training seconds and the run's wall time, and the managed tables'
   ids held / admitted / evicted.
2. ``memory``: the real managed model (build_retrieval_task + shard_model, user and item tables of ``--zch`` rows)
   trained on batches of raw ids drawn from id spaces growing to ``--max-ids``: table bytes, remapping bytes and
   the process's resident memory after each, beside what vocabulary tables of as many rows would take.

    $ python scripts/bench_continuous.py replay                 # ~15 min on 2 cores
    $ python scripts/bench_continuous.py memory --max-ids 10000000
    $ python scripts/bench_continuous.py replay --slices 3 --variants managed_incremental,managed_scratch

One process (gloo, one rank); the last line printed is a JSON object of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("managed_incremental", "managed_scratch", "vocab_incremental", "vocab_scratch")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("replay", "memory"))
    p.add_argument("--slices", type=int, default=7, help="replay: slices trained (0..N-1), each tested on the next")
    p.add_argument("--variants", default=",".join(VARIANTS), help="replay: runs per slice, comma-separated")
    p.add_argument("--out", default="", help="replay: where the run dirs go (default: a temporary folder)")
    p.add_argument("--data-root", default=str(ROOT / "data"), help="replay: data.root")
    p.add_argument("overrides", nargs="*", help="replay: extra Hydra overrides for every run")
    p.add_argument("--zch", type=int, default=1 << 16, help="memory: rows of each managed table")
    p.add_argument("--dim", type=int, default=32, help="memory: embedding dim")
    p.add_argument("--max-ids", type=int, default=10_000_000, help="memory: the largest id space")
    p.add_argument("--steps", type=int, default=40, help="memory: training steps per id space")
    p.add_argument("--batch", type=int, default=2048, help="memory: queries (= positives) per step")
    return p.parse_intermixed_args(argv)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from recsys.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_config(hydra_compose(config_name="config", overrides=["+experiment=daily", *overrides]))


def replay(args: argparse.Namespace) -> dict:
    from recsys.distributed.env import destroy_distributed, init_distributed
    from recsys.job.run import fit

    out = Path(args.out or tempfile.mkdtemp(prefix="bench_continuous_"))
    env = init_distributed("cpu", "gloo")
    rows = []
    try:
        for variant in args.variants.split(","):
            mapping, mode = variant.split("_")
            for k in range(args.slices):
                overrides = [f"data.root={args.data_root}", f"model.id_mapping={mapping}", f"data.slice={k}"]
                if mode == "scratch":
                    overrides.append("data.slice_window=0")
                elif k:
                    overrides.append(f"trainer.init_from={out / variant / f'slice{k - 1}'}")
                start = time.perf_counter()
                results = fit(compose([*overrides, *args.overrides]), out / variant / f"slice{k}")
                wall = time.perf_counter() - start
                row = {
                    "variant": variant,
                    "slice": k,
                    "tested_on": k + 1,
                    "recall@20": results["test"]["two_tower"]["recall@20"],
                    "popularity_recall@20": results["test"]["popularity"]["recall@20"],
                    "train_s": results["train"]["seconds"],
                    "wall_s": wall,
                    "examples": results["train"]["samples"] // compose(overrides).trainer.epochs,
                    "managed": results.get("managed", {}),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        destroy_distributed(env)
    print(replay_table(rows))
    return {"replay": rows, "run_dirs": str(out)}


def replay_table(rows: list[dict]) -> str:
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    slices = sorted({r["slice"] for r in rows})
    by = {(r["variant"], r["slice"]): r for r in rows}
    head = (
        "| trained on -> tested on | "
        + " | ".join(f"{v} R@20 (train s / wall s)" for v in variants)
        + " | popularity |"
    )
    lines = [head, "|" + "---|" * (len(variants) + 2)]
    for k in slices:
        cells = []
        for v in variants:
            r = by.get((v, k))
            cells.append(f"{r['recall@20']:.4f} ({r['train_s']:.1f} / {r['wall_s']:.1f})" if r else "")
        pop = next(by[(v, k)]["popularity_recall@20"] for v in variants if (v, k) in by)
        lines.append(f"| {k} -> {k + 1} | " + " | ".join(cells) + f" | {pop:.4f} |")
    totals = [sum(by[(v, k)]["wall_s"] for k in slices if (v, k) in by) for v in variants]
    means = [sum(by[(v, k)]["recall@20"] for k in slices if (v, k) in by) / len(slices) for v in variants]
    lines.append(
        "| mean R@20, total wall s | " + " | ".join(f"{m:.4f}, {t:.0f} s" for m, t in zip(means, totals)) + " | |"
    )
    return "\n".join(lines)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from recsys.config import (
        DenseOptimConfig,
        IdMapping,
        ManagedConfig,
        ModelConfig,
        ShardingConfig,
        SparseOptimConfig,
        TableConfig,
    )
    from recsys.data.batch import Batch
    from recsys.data.layout import feature_layout
    from recsys.distributed.env import destroy_distributed, init_distributed
    from recsys.distributed.managed import managed_stats, sharded_managed
    from recsys.distributed.sharding import shard_model
    from recsys.model.build import build_retrieval_task

    env = init_distributed("cpu", "gloo")
    tables = {t: TableConfig(embedding_dim=args.dim, pooling="sum") for t in ("user", "item")}
    model = ModelConfig(
        tables=tables,
        tower_dims=[args.dim],
        id_mapping=IdMapping.managed,
        managed=ManagedConfig(zch_size={"user": args.zch, "item": args.zch}),
    )
    spaces = sorted({args.max_ids // 10, args.max_ids // 5, args.max_ids // 2, args.max_ids})
    # logQ needs a frequency per catalogue item: the one O(id space) array here, data-side (uniform)
    task = build_retrieval_task(
        model, num_rows={"user": spaces[-1], "item": spaces[-1]}, item_counts=torch.ones(spaces[-1]), seed=0,
        layout=feature_layout(history_length=0, has_categories=False),
    )  # fmt: skip
    sharded = shard_model(
        task, sharding=ShardingConfig(), sparse=SparseOptimConfig(), dense=DenseOptimConfig(), env=env, seed=0,
        batch_size_per_rank=args.batch,
    )  # fmt: skip
    dmp = sharded.module
    dmp.train()
    rng = np.random.default_rng(0)
    rows, b = [], args.batch
    start_rss = rss_mb()
    for space in spaces:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            # Zipf-like ids over the whole space: a few hot ids and a long tail of new ones each step
            users = (rng.pareto(1.2, b) * space / 50).astype(np.int64) % space
            items = (rng.pareto(1.2, b) * space / 50).astype(np.int64) % space
            features = KeyedJaggedTensor(
                keys=["user", "item"],
                values=torch.from_numpy(np.concatenate([users, items])),
                lengths=torch.from_numpy(np.r_[np.ones(b), np.zeros(b), np.zeros(b), np.ones(b)].astype(np.int32)),
            )
            no_history = torch.zeros(b, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)  # the user id alone
            loss, _ = dmp(
                Batch(features, torch.from_numpy(items), b, history_lengths=no_history[0], history_items=no_history[1])
            )
            loss.backward()
            sharded.optimizer.step()
            sharded.optimizer.zero_grad()
        seconds = time.perf_counter() - t0
        table_bytes = remap_bytes = 0
        for module in sharded_managed(dmp):
            for tbe, index in module._table_to_tbe_and_index.values():
                weights = tbe.split_embedding_weights()[int(index)]
                state = tbe.get_optimizer_state()
                table_bytes += weights.numel() * weights.element_size()
                table_bytes += sum(v.numel() * v.element_size() for v in state[int(index)].values()) if state else 0
            for buffer in module._managed_collision_collection.buffers():
                remap_bytes += buffer.numel() * buffer.element_size()
        stats = managed_stats(dmp, 1)
        vocab_bytes = 2 * space * (args.dim + 1) * 4  # a row (+ row-wise Adagrad's one float) per id, both tables
        row = {
            "id_space": space,
            "max_raw_id_seen": int(max(users.max(), items.max())),
            "table_mb": table_bytes / 2**20,
            "remap_mb": remap_bytes / 2**20,
            "rss_mb": rss_mb(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "vocab_table_mb": vocab_bytes / 2**20,
            "steps_per_s": args.steps / seconds,
            "managed": stats,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    del sharded, dmp, task
    destroy_distributed(env)
    lines = [
        f"managed tables: user and item, {args.zch} rows x {args.dim} each; {args.steps} steps of {b} queries per space"
        f" (RSS at start {start_rss:.0f} MB)",
        "| id space | table MB (+ Adagrad) | remapping MB | RSS MB | vocab tables would be MB | item ids held / evicted |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        item = r["managed"]["item"]
        lines.append(
            f"| {r['id_space']:,} | {r['table_mb']:.1f} | {r['remap_mb']:.1f} | {r['rss_mb']:.0f} | "
            f"{r['vocab_table_mb']:.0f} | {item['ids']:,} / {item['evicted']:,} |"
        )
    print("\n".join(lines))
    return {"memory": rows}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch_threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    import torch

    torch.set_num_threads(torch_threads)
    figures = replay(args) if args.part == "replay" else memory(args)
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
