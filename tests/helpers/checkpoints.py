"""Compare DCP checkpoints tensor by tensor, without a process group."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


def full_state(ckpt_dir: Path, tmp_path: Path) -> dict:
    """Every tensor of a DCP checkpoint, unsharded, loaded without a process group."""
    out = tmp_path / f"{ckpt_dir.parent.parent.name}-{ckpt_dir.name}.pt"
    dcp_to_torch_save(str(ckpt_dir), str(out))
    return torch.load(out, weights_only=False)


def assert_same_tensors(a: dict, b: dict, path: str = "") -> None:
    """Same keys at every level, and every tensor equal bit for bit."""
    assert a.keys() == b.keys(), path
    for key in a:
        if isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key], f"{path}.{key}")
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{path}.{key}"
