"""What a ranker's resource check is asked about before any work: the size of what it will be fit on and the memory
the host has (a ranker that would not fit is refused then, not after training)."""

from __future__ import annotations

from dataclasses import dataclass


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
