"""Benchmark the in-batch softmax's row-blocked form against the dense one: time and peak memory of a forward +
backward, side by side in one run, and how far apart their gradients are.

The inputs are a training step's shape: B unit-norm queries and B in-batch candidates plus ``--negatives`` uniform
ones (C = B + negatives), item ids drawn from a catalogue of ``--num-items`` by a Zipf-like law (so accidental
hits exist to mask), the logQ correction on. The last line printed is a JSON object.

    $ python scripts/bench_loss.py --batch 16384 --dim 64                  # CPU
    $ python scripts/bench_loss.py --batch 131072 --dim 64 --device cuda   # one GPU: dense is null where it cannot fit

Peak memory is what the loss allocates above its inputs: on CUDA torch.cuda.max_memory_allocated, on CPU the
profiler's allocation counter (torch.profiler, profile_memory) over one extra, untimed round. ``--precision bf16``
runs both forms under autocast, as trainer.precision=bf16 does. ``--history L`` gives each query a bag of L items drawn
by the same law and masks them (model.loss.mask_history), and times the blocked form without the mask beside it
("unmasked_ms", "mask_time_ratio").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from recsys.components.losses.in_batch_softmax import block_rows_for, resolve_block_mb, sampled_softmax_loss


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16384, help="queries B (and in-batch candidates)")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension D")
    p.add_argument("--negatives", type=int, default=0, help="uniform negatives added to the B candidates")
    p.add_argument("--num-items", type=int, default=1_000_000, help="catalogue the candidates' ids come from")
    p.add_argument(
        "--block-mb",
        type=float,
        default=-1,
        help="the blocked form's logits budget (MiB); -1: the device's auto budget",
    )
    p.add_argument("--rounds", type=int, default=5, help="timed forward + backward rounds of each form")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--history", type=int, default=0, help="items in each query's masked bag (0: no mask)")
    return p.parse_args(argv)


def make_inputs(args: argparse.Namespace, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(args.seed)
    num_candidates = args.batch + args.negatives
    queries = torch.nn.functional.normalize(torch.randn(args.batch, args.dim, generator=g), dim=1)
    candidates = torch.nn.functional.normalize(torch.randn(num_candidates, args.dim, generator=g), dim=1)
    # popular ids repeat (accidental hits to mask): ranks drawn as floor(N^u), u uniform, a Zipf-like law
    item_ids = torch.pow(float(args.num_items), torch.rand(num_candidates, generator=g)).long() - 1
    item_ids[args.batch :] = torch.randint(0, args.num_items, (args.negatives,), generator=g)
    log_q = torch.log(torch.rand(num_candidates, generator=g) * 1e-3 + 1e-6)
    inputs = {
        "queries": queries.to(device),
        "candidates": candidates.to(device),
        "labels": torch.arange(args.batch, device=device),
        "query_item_ids": item_ids[: args.batch].to(device),
        "candidate_item_ids": item_ids.to(device),
        "candidate_log_q": log_q.to(device),
    }
    if args.history:
        bags = torch.pow(float(args.num_items), torch.rand(args.batch * args.history, generator=g)).long() - 1
        lengths = torch.full((args.batch,), args.history, dtype=torch.int64)
        inputs["query_history"] = (lengths.to(device), bags.to(device))
    return inputs


def step(inputs: dict, block_mb: float, precision: str) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One forward + backward from fresh leaves: (loss, dL/dqueries, dL/dcandidates)."""
    q = inputs["queries"].clone().requires_grad_()
    c = inputs["candidates"].clone().requires_grad_()
    device = q.device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    rest = {k: v for k, v in inputs.items() if k not in ("queries", "candidates")}
    with autocast:
        loss = sampled_softmax_loss(q, c, temperature=0.05, block_mb=block_mb, **rest)
    loss.backward()
    return loss.detach(), q.grad, c.grad


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mb(inputs: dict, block_mb: float, precision: str) -> float | None:
    """MiB the loss's forward + backward allocates at its peak above what was allocated before; None when it runs
    out of memory."""
    device = inputs["queries"].device
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            step(inputs, block_mb, precision)
            _sync(device)
            return (torch.cuda.max_memory_allocated(device) - before) / 2**20
        return _cpu_peak_mb(lambda: step(inputs, block_mb, precision))
    except torch.OutOfMemoryError:
        return None


def _cpu_peak_mb(fn) -> float:
    """The most bytes allocated at once while ``fn`` runs, from the profiler's CPU allocation events."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    return max((e["args"]["Total Allocated"] for e in memory), default=0) / 2**20


def time_forms(inputs: dict, forms: dict, rounds: int, precision: str) -> dict:
    """Median ms of each form's forward + backward, the forms alternating round by round (the same load on each)."""
    device = inputs["queries"].device
    times = {name: [] for name in forms}
    for block_mb in forms.values():  # warm-up: kernels chosen, caches filled
        step(inputs, block_mb, precision)
    for _ in range(rounds):
        for name, block_mb in forms.items():
            _sync(device)
            start = time.perf_counter()
            step(inputs, block_mb, precision)
            _sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: the largest difference relative to the gradient's scale."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    args.block_mb = resolve_block_mb(args.block_mb, device)
    inputs = make_inputs(args, device)
    num_candidates = args.batch + args.negatives
    block_rows = block_rows_for(args.batch, num_candidates, args.block_mb)
    if block_rows >= args.batch:
        sys.exit(f"--block-mb {args.block_mb}: the whole {args.batch} x {num_candidates} fits, nothing to block")
    blocked_peak = peak_mb(inputs, args.block_mb, args.precision)
    dense_peak = peak_mb(inputs, 0.0, args.precision)
    forms = {"blocked": args.block_mb} if dense_peak is None else {"blocked": args.block_mb, "dense": 0.0}
    ms = time_forms(inputs, forms, args.rounds, args.precision)
    if args.history:  # the blocked form without the mask, timed apart (its own warm-up and rounds)
        unmasked = {k: v for k, v in inputs.items() if k != "query_history"}
        ms["unmasked"] = time_forms(unmasked, {"blocked": args.block_mb}, args.rounds, args.precision)["blocked"]
    out = {
        "device": str(device),
        "batch": args.batch,
        "dim": args.dim,
        "num_candidates": num_candidates,
        "precision": args.precision,
        "block_mb": args.block_mb,
        "block_rows": block_rows,
        "blocked_peak_mb": round(blocked_peak, 1) if blocked_peak is not None else None,
        "dense_peak_mb": round(dense_peak, 1) if dense_peak is not None else None,
        "blocked_ms": round(ms["blocked"], 2),
        "dense_ms": round(ms["dense"], 2) if "dense" in ms else None,
        "max_rel_grad_diff": None,
        "loss_rel_diff": None,
        "history": args.history,
    }
    if "unmasked" in ms:
        out["unmasked_ms"] = round(ms["unmasked"], 2)
        out["mask_time_ratio"] = round(ms["blocked"] / ms["unmasked"], 3)
    if dense_peak is not None:
        loss_b, gq_b, gc_b = step(inputs, args.block_mb, args.precision)
        loss_d, gq_d, gc_d = step(inputs, 0.0, args.precision)
        out["max_rel_grad_diff"] = max(max_rel_diff(gq_b, gq_d), max_rel_diff(gc_b, gc_d))
        out["loss_rel_diff"] = float((loss_b - loss_d).abs() / loss_d.abs())
        out["time_ratio"] = round(ms["blocked"] / ms["dense"], 3)
        out["peak_ratio"] = round(blocked_peak / dense_peak, 3)
    print(
        f"B={args.batch} C={num_candidates} D={args.dim} {args.precision} on {device}: blocked ({block_rows} rows a block)"
        f" {out['blocked_ms']} ms, peak {out['blocked_peak_mb']} MiB; dense {out['dense_ms']} ms,"
        f" peak {out['dense_peak_mb']} MiB"
    )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
