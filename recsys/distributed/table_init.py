"""Initialise sharded embedding tables identically for every world size and sharding plan.

Each table is filled in blocks of ``BLOCK_ROWS`` rows drawn from a generator seeded by
(seed, table, block): a shard only generates the blocks it overlaps, so a 10^9-row table
row-wise over 64 GPUs costs each rank 1/64 of the work, and a 2-rank run starts from exactly
the weights of a 1-rank run (torchrec would draw each shard from its own generator).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

BLOCK_ROWS = 65536  # rows per generator block; fixed forever, or the same seed gives other weights


def _block_seed(seed: int, table: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}/{table}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def fill_rows(dst: torch.Tensor, *, seed: int, table: str, row0: int, col0: int, num_rows: int, dim: int) -> None:
    """Write rows [row0, row0+len(dst)) and columns [col0, col0+dst.shape[1]) of the table.

    Values ~ U(-1/sqrt(num_rows), 1/sqrt(num_rows)), torchrec's default bound. They are drawn on
    the CPU whatever ``dst``'s device (CUDA's generator gives other numbers for the same seed), so
    a GPU run starts from the weights of a CPU run.
    """
    bound = num_rows**-0.5
    row_end = row0 + dst.shape[0]
    block = row0 // BLOCK_ROWS
    while block * BLOCK_ROWS < row_end:
        start = block * BLOCK_ROWS
        rows = min(BLOCK_ROWS, num_rows - start)
        gen = torch.Generator().manual_seed(_block_seed(seed, table, block))
        values = torch.empty(rows, dim).uniform_(-bound, bound, generator=gen)
        lo, hi = max(row0, start), min(row_end, start + rows)
        dst[lo - row0 : hi - row0].copy_(values[lo - start : hi - start, col0 : col0 + dst.shape[1]])
        block += 1


def _table_name(key: str) -> str:
    # "model.ebc.embedding_bags.<table>.weight", "model.ec.embeddings.<table>.weight"
    return key.split(".")[-2]


@torch.no_grad()
def init_tables(dmp: nn.Module, *, seed: int) -> None:
    for key, value in dmp.state_dict().items():
        if not (".embedding_bags." in key or ".ec.embeddings." in key) or not key.endswith(".weight"):
            continue
        table = _table_name(key)
        if isinstance(value, ShardedTensor):
            num_rows, dim = value.size()
            for shard in value.local_shards():
                row0, col0 = shard.metadata.shard_offsets
                fill_rows(shard.tensor, seed=seed, table=table, row0=row0, col0=col0, num_rows=num_rows, dim=dim)
        else:  # data_parallel: a full replica on every rank
            num_rows, dim = value.shape
            fill_rows(value, seed=seed, table=table, row0=0, col0=0, num_rows=num_rows, dim=dim)
