"""Collectives the training task, evaluation and export need, kept out of recsys/model/."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

from recsys.data.batch_bounds import rank_shares
from recsys.model.task import LocalCandidates


class GatheredCandidates(nn.Module):
    """All-gather the ranks' candidate blocks in rank order; differentiable for float inputs.

    Block sizes are ``sizes`` when given (one per rank), else ``rank_shares(global_size,
    world_size)`` (they may differ by one row): blocks are padded to the largest, gathered, and unpadded. Gradients flowing into other
    ranks' blocks are summed back to their owner (the backward of all_gather), which together
    with DDP's average makes N ranks match one process.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def forward(
        self, t: torch.Tensor, global_size: int, sizes: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, int]:
        sizes = rank_shares(global_size, self.world_size) if sizes is None else list(sizes)
        if sizes[self.rank] != t.shape[0]:
            raise ValueError(
                f"rank {self.rank} holds {t.shape[0]} candidates, expected {sizes[self.rank]} of {global_size}"
            )
        widest = max(sizes)
        padded = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1) + (0, widest - t.shape[0])).contiguous()
        if t.requires_grad:
            parts: list[torch.Tensor] = list(dist_fn.all_gather(padded))
        else:
            parts = [torch.empty_like(padded) for _ in range(self.world_size)]
            dist.all_gather(parts, padded)
        return torch.cat([p[:size] for p, size in zip(parts, sizes)]), sum(sizes[: self.rank])


def candidate_gather(rank: int, world_size: int) -> nn.Module:
    return LocalCandidates() if world_size == 1 else GatheredCandidates(rank, world_size)


def all_gather_rows(
    t: torch.Tensor, world_size: int, *, device: torch.device | None = None, round_bytes: int = 256 << 20
) -> torch.Tensor:
    """Concatenate each rank's ``n_r x ...`` block (sizes may differ) in rank order; the result is on ``t.device``.

    The collectives run on ``device`` (default ``t.device``): NCCL gathers only CUDA tensors, so a
    CPU block travels through the GPU in rounds of at most ``round_bytes`` per rank, and the GPU
    never holds more than one round from every rank (a 10^8 x 128 item table would not fit whole).
    """
    if world_size == 1:
        return t
    comm = device if device is not None else t.device
    sizes_t = [torch.zeros(1, dtype=torch.int64, device=comm) for _ in range(world_size)]
    dist.all_gather(sizes_t, torch.tensor([t.shape[0]], dtype=torch.int64, device=comm))
    sizes = [int(s.item()) for s in sizes_t]
    row_bytes = max(1, math.prod(t.shape[1:]) * t.element_size())
    rows_per_round = max(1, round_bytes // row_bytes)
    starts = [sum(sizes[:r]) for r in range(world_size)]
    out = torch.empty((sum(sizes), *t.shape[1:]), dtype=t.dtype, device=t.device)
    for lo in range(0, max(sizes), rows_per_round):
        width = min(rows_per_round, max(sizes) - lo)  # every rank sends this many rows, padded with zeros
        padded = torch.zeros((width, *t.shape[1:]), dtype=t.dtype, device=comm)
        piece = t[lo : lo + width]
        padded[: piece.shape[0]] = piece.to(comm)
        parts = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(parts, padded)
        for rank, part in enumerate(parts):
            n = min(max(sizes[rank] - lo, 0), width)
            out[starts[rank] + lo : starts[rank] + lo + n] = part[:n].to(t.device)
    return out


@torch.no_grad()
def full_tables(module: nn.Module, rank: int, device: torch.device = torch.device("cpu")) -> dict:
    """Every embedding table whole on rank 0, on the CPU (collective; other ranks get an empty dict).

    The gather runs on ``device``, the process group's device: NCCL rejects CPU output buffers.
    """
    out = {}
    for key, value in module.state_dict().items():
        # EmbeddingBagCollections' tables, and an EmbeddingCollection's (the sequence table, looked up per position)
        if ".embedding_bags." not in key and ".ec.embeddings." not in key:
            continue
        table = key.split(".")[-2]
        if isinstance(value, ShardedTensor):
            full = torch.empty(value.size(), device=device) if rank == 0 else None
            value.gather(dst=0, out=full)
        else:
            full = value.detach()
        if rank == 0:
            out[table] = full.cpu().clone()
    return out
