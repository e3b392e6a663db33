"""The training loader alone (no model): batches built on the training device vs. on the host, side by side.

    $ .venv/bin/python scripts/bench_loader.py --shape gowalla                # +experiment=gowalla's batches, CPU
    $ .venv/bin/python scripts/bench_loader.py --shape movielens --device cuda  # the synthetic default, one GPU
    $ .venv/bin/python scripts/bench_loader.py --shape embedding              # 1e6 users / items, bags of 100

Shapes: ``gowalla`` is ``+experiment=gowalla`` (../shared/data/gowalla, prepared as the training prepares it:
profile bags of up to 50, the neighbour table, batch 1024); ``movielens`` is the default config, what ``make run``
trains (the synthetic MovieLens-1M-shaped dataset); ``embedding`` is scripts/bench_train.py's embedding-bound shape
(batch 2048, 1e6 users and items, recent bags of 100 items and their categories). Extra arguments are Hydra
overrides for the first two.

Two loaders over the same epochs, alternating round by round (``--rounds``, each ``--batches`` batches from the
start of a fresh epoch, its first batch, which also draws the epoch's order, untimed):

- ``device``: ``TrainBatches(device=...)``, the batches built with torch ops on the device (trainer.loader=device);
- ``host``: today's loader, numpy on the host; on a GPU each batch pinned and copied with non_blocking, as the
  trainer does with it (trainer.loader=host).

Both run as the trainer runs them, on their prefetch thread (2 batches ahead); the consumer takes each batch
(and on a GPU waits for the device at the end of the round). Batches per second are medians over rounds; the last
line printed is one JSON object: ``samples_per_s``, ``batches_per_s`` (device), ``host_samples_per_s``,
``ratio_vs_host`` (device / host, the median of the rounds' paired ratios).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from recsys.data.batches import TrainBatches

ROOT = Path(__file__).resolve().parents[1]
SHAPE_OVERRIDES = {"gowalla": ["+experiment=gowalla"], "movielens": []}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=["gowalla", "movielens", "embedding"], default="gowalla")
    p.add_argument("--device", default="cpu", help="the training device: cpu or cuda")
    p.add_argument("--batches", type=int, default=100, help="timed batches per round")
    p.add_argument("--rounds", type=int, default=4, help="rounds of each loader, alternating")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (gowalla, movielens)")
    return p.parse_args(argv)


def configured_loaders(overrides: list[str], device: torch.device) -> dict[str, TrainBatches]:
    """The host and device loaders of the run ``python -m recsys.train <overrides>`` would train (its dataset
    prepared if it is not there yet)."""
    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config
    from recsys.distributed.env import DistEnv
    from recsys.job.assemble import load_data, train_batches
    from recsys.job.plan import run_layout

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=[*overrides, f"sharding.device={device.type}"]))
    env = DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, device=device, backend="none")
    data, counts = load_data(cfg, env)
    return {
        name: train_batches(cfg, data, run_layout(cfg, data), env, counts, loader=name) for name in ("device", "host")
    }


def embedding_loaders(device: torch.device) -> dict[str, TrainBatches]:
    """bench_train's embedding-bound shape, its synthetic dataset, recent histories."""
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "scripts" / "bench_train.py")
    bench_train = importlib.util.module_from_spec(spec)
    sys.modules["bench_train"] = bench_train  # its dataclasses look their module up
    spec.loader.exec_module(bench_train)
    shape = bench_train.SHAPES["embedding"]
    data = bench_train.synthetic_data(shape)
    kwargs = dict(history_length=shape.history_length, global_batch_size=shape.batch_size, num_negatives=0, seed=0)
    return {
        "device": TrainBatches(data, device=device, **kwargs),
        "host": TrainBatches(data, pin_memory=device.type == "cuda", **kwargs),
    }


def time_round(batches: TrainBatches, epoch: int, num: int, device: torch.device, copy: bool) -> tuple[float, int]:
    """(seconds, samples) of ``num`` batches of ``epoch`` after its first; ``copy``: each moved to ``device``
    (non_blocking, from pinned memory), as the trainer's step does with a host batch."""
    source = batches.epoch(epoch)
    next(source)
    samples = 0
    start = time.perf_counter()
    for _ in range(num):
        try:
            batch = next(source)
        except StopIteration:
            break
        if copy:
            batch = batch.to(device, non_blocking=True)
        samples += batch.num_queries
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if hasattr(source, "close"):
        source.close()
    return seconds, samples


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.shape == "embedding":
        loaders = embedding_loaders(device)
    else:
        loaders = configured_loaders([*SHAPE_OVERRIDES[args.shape], *args.overrides], device)
    rates: dict[str, list[tuple[float, float]]] = {"device": [], "host": []}
    for r in range(args.rounds):
        for name in ("device", "host") if r % 2 == 0 else ("host", "device"):
            copy = name == "host" and device.type != "cpu"
            seconds, samples = time_round(loaders[name], r, args.batches, device, copy)
            num = args.batches if samples else 0
            rates[name].append((samples / seconds, num / seconds))
    samples_per_s = statistics.median(r[0] for r in rates["device"])
    host_samples_per_s = statistics.median(r[0] for r in rates["host"])
    ratio = statistics.median(d[0] / h[0] for d, h in zip(rates["device"], rates["host"]))
    batch_size = loaders["device"].global_batch_size
    print(
        f"{args.shape} on {device} (batch {batch_size}): device loader {samples_per_s:,.0f} samples/s, "
        f"host loader {host_samples_per_s:,.0f} samples/s, paired ratio {ratio:.3f}"
    )
    out = {
        "shape": args.shape,
        "device": str(device),
        "global_batch_size": batch_size,
        "samples_per_s": round(samples_per_s),
        "batches_per_s": round(statistics.median(r[1] for r in rates["device"]), 1),
        "host_samples_per_s": round(host_samples_per_s),
        "ratio_vs_host": round(ratio, 3),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
