"""What a ranker's resource check and cost estimate are asked about before any work: the size of what it will be fit on
and rank, and the memory and speed the host has (a ranker that would not fit is refused then, not after training; one
of the default list that would take out of proportion is lowered or left out: recsys/rankers/stage_cost.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.rankers.cost import Throughput, host_throughput


@dataclass(frozen=True)
class Resources:
    num_items: int
    num_users: int  # users of the dataset (the rows a fit's X has)
    interactions: int  # rows the evaluation stage fits on (train + valid)
    fits_per_host: int = 1  # fits running at once on this host (one per rank with data.shard_by_user)
    available_bytes: int | None = None  # the host's memory available; None: unknown (no check)
    # rankers whose fits are served or fused (their item vectors kept whole): the parts of the served ranker and of
    # every fusion listed
    served_parts: frozenset[str] = frozenset()
    valid_users: int = 0  # users the stage ranks on valid (this rank's, with data.shard_by_user); 0: no valid split
    test_users: int = 0  # users the stage ranks on test; 0: unknown (taken as num_users)
    query_dim: int = 64  # the two-tower's vector width D
    chunk_size: int = 4096  # users scored per block (eval.chunk_size)
    throughput: Throughput = field(default_factory=host_throughput)  # this host's rates (recsys/rankers/cost.py)
