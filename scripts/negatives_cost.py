"""What model.negatives costs a training step: FLOPs and bytes per step by formula (so a GPU's cost is known without
one), and the loss's own forward + backward measured here, side by side with the in-batch softmax alone.

    $ python scripts/negatives_cost.py                                  # Gowalla's shape (the defaults below)
    $ python scripts/negatives_cost.py --batch 8192 --catalogue 1000000 --measure 0

Per step, C candidates (the B in-batch positives + model.negatives.num, or the catalogue I with num = -1):
- the loss's three GEMMs (logits, dq, dc): 6 B C D FLOPs; its logits B C x 4 bytes, in row blocks of block_mb;
- the candidate tower on C rows: 6 C D_in D FLOPs (forward and backward of one linear layer);
- the candidate's table rows: C x lookups x D_table x 4 bytes read, and about 3x that in the fused optimizer's
  backward (the gradient, row-wise Adagrad's state, the rows written back).
"""

from __future__ import annotations

import argparse
import time

import torch

from recsys.components.losses.in_batch_softmax import sampled_softmax_loss


def step_cost(batch: int, candidates: int, dim: int, tower_in: int, lookups: int, table_dim: int) -> dict:
    gemm = 6 * batch * candidates * dim
    tower = 6 * candidates * tower_in * dim
    rows = candidates * lookups * table_dim * 4
    return {"gflop": (gemm + tower) / 1e9, "table_gb": 4 * rows / 1e9, "logits_gb": batch * candidates * 4 / 1e9}


def measure_loss(batch: int, candidates: int, dim: int, repeats: int) -> float:
    """Seconds for one forward + backward of the sampled softmax (fp32, CPU, blocked as model.loss.block_mb=-1)."""
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(batch, dim), dim=1).requires_grad_()
    c = torch.nn.functional.normalize(torch.randn(candidates, dim), dim=1).requires_grad_()
    args = dict(
        labels=torch.arange(batch),
        query_item_ids=torch.arange(batch),
        candidate_item_ids=torch.arange(candidates),
        candidate_log_q=torch.zeros(candidates),
        temperature=0.1,
        block_mb=-1,
    )
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sampled_softmax_loss(q, c, **args).backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=256, help="tower output")
    parser.add_argument("--tower-in", type=int, default=512, help="candidate tower input (item + neighbour tables)")
    parser.add_argument("--lookups", type=int, default=21, help="table rows per candidate (its id + 20 neighbours)")
    parser.add_argument("--table-dim", type=int, default=256)
    parser.add_argument("--catalogue", type=int, default=40981, help="items (num = -1 scores every one)")
    parser.add_argument("--measure", type=int, default=3, help="repeats of the loss on this CPU; 0: formulas only")
    args = parser.parse_args()
    sizes = [("in-batch", args.batch)] + [(f"+{n}", args.batch + n) for n in (4096, 16384, 65536)]
    sizes.append((f"catalogue {args.catalogue}", args.catalogue))
    base = None
    print("negatives | candidates C | GFLOP/step | table GB/step | logits GB | loss fwd+bwd s (CPU) | x in-batch")
    for name, c in sizes:
        cost = step_cost(args.batch, c, args.dim, args.tower_in, args.lookups, args.table_dim)
        seconds = measure_loss(args.batch, c, args.dim, args.measure) if args.measure else float("nan")
        base = seconds if base is None else base
        print(
            f"{name} | {c} | {cost['gflop']:.1f} | {cost['table_gb']:.2f} | {cost['logits_gb']:.2f} | "
            f"{seconds:.3f} | {seconds / base:.1f}"
        )


if __name__ == "__main__":
    main()
