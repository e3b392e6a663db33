"""The training step of a configured run, on that run's own batches: where a run's training time goes.

    $ .venv/bin/python scripts/bench_run_step.py +experiment=gowalla
    $ .venv/bin/python scripts/bench_run_step.py --variants precision=fp32,precision=bf16      # the synthetic default
    $ .venv/bin/python scripts/bench_run_step.py +experiment=gowalla --variants split=regroup,split=tower_inputs
    $ python scripts/bench_run_step.py +experiment=gowalla --device cuda --profile 20   # one GPU: kernel time vs step

Builds what ``python -m recsys.train <overrides>`` trains (preparing the dataset as the training does, if it is not
there yet), pre-builds ``--batches`` batches of epoch 1 without the prefetch thread, then times:

- the loader: ms per batch (``TrainBatches.epoch`` on this thread, nothing else running);
- the trainer's own step (``make_train_step``) per variant: ``--rounds`` rounds, each running every variant over
  the pre-built batches in turn (the order alternates), wall and process-CPU ms per step. The paired ratio is the
  median over rounds of each round's wall-time ratio to the first variant: robust to load that comes and goes.

A variant is settings joined by ``+`` (the others stay the run's): ``precision=fp32|bf16`` (trainer.precision of
the step), ``split=tower_inputs|regroup`` (how the pooled lookups become the towers' inputs: recsys's row split and
column views, or torchrec's ``KeyedTensor.regroup``, which this module keeps only to measure against),
``threads=N`` (torch's intra-op threads), ``switch=MS`` (Python's GIL switch interval, sys.setswitchinterval) and
``loader=prebuilt|live`` (live: the step takes its batches from the
trainer's prefetching loader, whose thread then competes for the cores, as in a run).

On a GPU (``--device cuda`` or ``sharding.device=cuda``) the step is the trainer's ``trainer.pipeline=none`` step: the
pinned batch copied with non_blocking inside it, each round bracketed by torch.cuda.synchronize. ``--profile N`` then
records CUDA activities too: operators by self device time, the device's busy time per step (kernels and copies) and
the stall share, the step's wall time the device spent idle (``stall_share`` under the profiler, whose own overhead
lengthens the step; ``stall_share_unprofiled`` against the timed rounds' step).

On a shared virtual machine the host may take CPU time from the guest ("steal"): the script prints the share of
CPU time stolen while it timed, since wall times are only comparable at similar steal. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torchrec.sparse.jagged_tensor import KeyedTensor

import recsys.model.two_tower as two_tower
from recsys.training.trainer import make_train_step, resolve_precision

ROOT = Path(__file__).resolve().parents[1]


def regroup(pooled, query_keys, candidate_keys, num_queries):
    """The towers' inputs as torchrec's KeyedTensor.regroup builds them (what recsys did before tower_inputs)."""
    if query_keys:
        query_in, candidate_in = KeyedTensor.regroup(pooled, [list(query_keys), list(candidate_keys)])
        return query_in[:num_queries], candidate_in[num_queries:]
    (candidate_in,) = KeyedTensor.regroup(pooled, [list(candidate_keys)])
    return candidate_in[:num_queries, :0], candidate_in[num_queries:]


SPLITS = {"tower_inputs": two_tower.tower_inputs, "regroup": regroup}


def parse_variant(variant: str, run_precision: str) -> dict:
    """``precision=bf16+threads=1`` -> every setting of the variant, the run's where it names none."""
    settings = {"precision": run_precision, "split": "tower_inputs", "threads": 0, "loader": "prebuilt", "switch": 0.0}
    allowed = {"precision": ("fp32", "bf16"), "split": tuple(SPLITS), "loader": ("prebuilt", "live")}
    for part in variant.split("+"):
        key, _, value = part.partition("=")
        if key == "threads" and value.isdigit() and int(value) > 0:
            settings[key] = int(value)
        elif key == "switch" and value.replace(".", "", 1).isdigit() and float(value) > 0:
            settings[key] = float(value)
        elif value in allowed.get(key, ()):
            settings[key] = value
        else:
            raise SystemExit(
                f"--variants: {part!r} in {variant!r}: expected precision=fp32|bf16, split=tower_inputs|regroup, "
                "threads=N, switch=MS or loader=prebuilt|live, joined by '+'"
            )
    return settings


def cpu_ticks() -> tuple[int, int]:
    """(all, stolen) jiffies of every CPU since boot, from /proc/stat; (0, 0) where it is not readable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return sum(fields[:8]), fields[7]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def busy_ms(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) spans in microseconds, in milliseconds: the device's busy time
    (kernels and copies that overlap on several streams count once)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total / 1e3


def profile_steps(step, batches: list, device: torch.device, rows: int) -> dict:
    """torch.profiler over one step per batch (CPU activities, and CUDA's on a GPU): the operators by self CPU time
    (and by self device time), the wall time per step under the profiler and, on a GPU, the device's busy time per
    step (kernels and copies, overlaps once) and the stall share: the share of the step's wall time the device idled."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        start = time.perf_counter()
        for batch in batches:
            step(iter([batch]))
        sync(device)
        wall_ms = (time.perf_counter() - start) * 1e3 / len(batches)
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=rows))
    out = {"steps": len(batches), "wall_ms_per_step": round(wall_ms, 2)}
    if cuda:
        print(averages.table(sort_by="self_device_time_total", row_limit=rows))
        spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy = busy_ms(spans) / len(batches)
        out.update(device_busy_ms_per_step=round(busy, 3), stall_share=round(1 - busy / wall_ms, 3))
        print(
            f"device busy {busy:.2f} ms of a {wall_ms:.2f} ms step (under the profiler): stall share {1 - busy / wall_ms:.0%}"
        )
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m recsys.train")
    p.add_argument("--variants", default="split=tower_inputs", help="comma-separated variants (see above)")
    p.add_argument("--batches", type=int, default=40, help="pre-built batches, each stepped once per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=8, help="steps before timing")
    p.add_argument(
        "--profile", type=int, default=0, help="after timing, torch.profiler over this many steps of the first variant"
    )
    p.add_argument("--profile-rows", type=int, default=15, help="operators listed, by self CPU (and device) time")
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default=None, help="sharding.device of the run (default: the config's)"
    )
    args = p.parse_args(argv)
    if args.device:
        args.overrides.append(f"sharding.device={args.device}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config
    from recsys.distributed.env import destroy_distributed, init_distributed
    from recsys.job.assemble import load_data, shard_for_training, train_batches
    from recsys.job.plan import run_layout

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=args.overrides))
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend)
    sharded = None
    try:
        data, counts = load_data(cfg, env)
        batches = train_batches(cfg, data, run_layout(cfg, data), env, counts)
        batches.prefetch = 0
        epoch = batches.epoch(1)
        next(epoch)  # the first batch also draws the epoch's order
        start = time.perf_counter()
        prebuilt = [next(epoch) for _ in range(args.batches)]
        loader_ms = (time.perf_counter() - start) / args.batches * 1e3
        sharded = shard_for_training(cfg, data, run_layout(cfg, data), env)
        run_precision = resolve_precision(cfg.trainer.precision, env.device)
        settings = {v: parse_variant(v, run_precision) for v in args.variants.split(",")}
        steps = {v: make_train_step("none", sharded, env, st["precision"]).step for v, st in settings.items()}
        names = list(steps)
        threads, switch = torch.get_num_threads(), sys.getswitchinterval()
        for batch in prebuilt[: args.warmup]:
            steps[names[0]](iter([batch]))
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        ticks0 = cpu_ticks()
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                st = settings[name]
                two_tower.tower_inputs = SPLITS[st["split"]]
                torch.set_num_threads(st["threads"] or threads)
                sys.setswitchinterval(st["switch"] / 1e3 if st["switch"] else switch)
                batches.prefetch = 2 if st["loader"] == "live" else 0
                source = batches.epoch(2 + r) if st["loader"] == "live" else iter(prebuilt)
                sync(env.device)
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(len(prebuilt)):
                    steps[name](source)
                sync(env.device)  # the steps' kernels, not just their launch
                times[name].append(
                    (
                        (time.perf_counter() - wall) / len(prebuilt) * 1e3,
                        (time.process_time() - cpu) / len(prebuilt) * 1e3,
                    )
                )
                if hasattr(source, "close"):
                    source.close()  # the live loader's thread stops here, not at the epoch's end
        two_tower.tower_inputs = SPLITS["tower_inputs"]
        torch.set_num_threads(threads)
        sys.setswitchinterval(switch)
        ticks1 = cpu_ticks()
        steal = (ticks1[1] - ticks0[1]) / max(1, ticks1[0] - ticks0[0])
        batch_size = prebuilt[0].num_queries
        out = {"loader_ms_per_batch": round(loader_ms, 2), "steal_share": round(steal, 3), "torch_threads": threads}
        print(f"loader: {loader_ms:.1f} ms per batch of {batch_size} (this thread alone)")
        for name in names:
            wall = statistics.median(t[0] for t in times[name])
            cpu = statistics.median(t[1] for t in times[name])
            ratio = statistics.median(a[0] / b[0] for a, b in zip(times[name], times[names[0]]))
            print(
                f"{name}: wall {wall:.1f} ms/step ({batch_size / wall * 1e3:.0f} samples/s), CPU {cpu:.1f} ms/step, "
                f"paired wall ratio to {names[0]} {ratio:.3f}; rounds {[round(t[0]) for t in times[name]]}"
            )
            out[name] = {"wall_ms": round(wall, 1), "cpu_ms": round(cpu, 1), "paired_ratio": round(ratio, 3)}
        print(f"steal: {steal:.0%} of this machine's CPU time went to other guests while timing")
        if args.profile:
            two_tower.tower_inputs = SPLITS[settings[names[0]]["split"]]
            print(f"{names[0]}, {args.profile} steps (prebuilt batches):")
            out["profile"] = profile_steps(steps[names[0]], prebuilt[: args.profile], env.device, args.profile_rows)
            two_tower.tower_inputs = SPLITS["tower_inputs"]
            if "device_busy_ms_per_step" in out["profile"]:  # against the step's time without the profiler
                out["profile"]["stall_share_unprofiled"] = round(
                    1 - out["profile"]["device_busy_ms_per_step"] / out[names[0]]["wall_ms"], 3
                )
        print(json.dumps(out))
        return out
    finally:
        del sharded
        destroy_distributed(env)


if __name__ == "__main__":
    main()
