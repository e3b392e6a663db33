"""One console line for a sharding plan: per table its sharding type and ranks, per rank its table memory.

torchrec's own "Planner Statistics" box (about 90 lines, up to 2,000 characters wide) still
reaches the run's log file; this is what a user reads on the console::

    sharding plan: user table_wise on rank 0, item table_wise on rank 0, category table_wise on rank 0 |
    table weights per rank (fp32, without optimizer state): rank 0 0.03 MB
"""

from __future__ import annotations

from collections.abc import Iterable

from torchrec.distributed.types import ShardingPlan

BYTES_PER_VALUE = 4  # fp32 table rows
MB = 2**20
MAX_RANKS_LISTED = 8  # beyond this, the memory part gives the smallest and largest rank only


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ranks = sorted(set(ranks))
    out: list[str] = []
    for r in ranks:
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out) or "-"


def plan_summary(plan: ShardingPlan, table_shapes: dict[str, tuple[int, int]], world_size: int) -> str:
    """``table_shapes``: table -> (rows, dim), for tables the plan replicates (data_parallel: no shard spec)."""
    tables, rank_bytes = [], [0] * world_size
    for module_plan in plan.plan.values():
        for table, sharding in module_plan.items():
            spec = getattr(sharding, "sharding_spec", None)
            if spec is None:  # data_parallel: the whole table on each of its ranks
                rows, dim = table_shapes[table]
                shards = [(rank, rows * dim) for rank in sharding.ranks or range(world_size)]
            else:
                shards = [(s.placement.rank(), s.shard_sizes[0] * s.shard_sizes[1]) for s in spec.shards]
            for rank, values in shards:
                rank_bytes[rank] += values * BYTES_PER_VALUE
            tables.append(
                f"{table} {sharding.sharding_type} on rank{'s' if len({r for r, _ in shards}) > 1 else ''} "
                f"{rank_ranges(r for r, _ in shards)}"
            )
    if world_size <= MAX_RANKS_LISTED:
        memory = ", ".join(f"rank {r} {b / MB:.2f} MB" for r, b in enumerate(rank_bytes))
    else:
        low, high = (
            min(range(world_size), key=rank_bytes.__getitem__),
            max(range(world_size), key=rank_bytes.__getitem__),
        )
        memory = (
            f"smallest rank {low} {rank_bytes[low] / MB:.2f} MB, largest rank {high} {rank_bytes[high] / MB:.2f} MB"
        )
    return f"sharding plan: {', '.join(tables)} | table weights per rank (fp32, without optimizer state): {memory}"
