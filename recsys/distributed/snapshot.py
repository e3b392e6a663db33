"""In-memory copy of this rank's weights (table shards and towers), to keep the best epoch."""

from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor


def _local_tensors(value) -> List[torch.Tensor]:
    if isinstance(value, ShardedTensor):
        return [shard.tensor for shard in value.local_shards()]
    return [value]


@torch.no_grad()
def snapshot(module: nn.Module) -> Dict[str, List[torch.Tensor]]:
    return {k: [t.detach().clone() for t in _local_tensors(v)] for k, v in module.state_dict().items()}


@torch.no_grad()
def restore(module: nn.Module, saved: Dict[str, List[torch.Tensor]]) -> None:
    """Copy a snapshot back in place (state_dict tensors of fused tables are views of the kernels' weights)."""
    for key, value in module.state_dict().items():
        for dst, src in zip(_local_tensors(value), saved[key]):
            dst.copy_(src)
