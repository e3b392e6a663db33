"""Per-rank data (``data.shard_by_user``): each rank reads only its own users' rows of every split.

The users are cut into ``world_size`` contiguous ranges of about equal training rows
(``user_boundaries``: parquet metadata plus one row group per cut); rank r reads users
``[b[r], b[r+1])`` with a pyarrow filter, so row groups of other users are skipped, and no
process holds the whole dataset. Two numbers need every rank: the training frequency of each
item (logQ, popularity; summed over ranks) and each rank's number of training examples (the
epoch's batch count and every batch's per-rank sizes; gathered once).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from data_pipelines.dataset_dir import split_file
from recsys.data.dataset import RetrievalData, load_dataset, read_dataset_meta, user_boundaries, with_valid_in_train
from recsys.distributed.env import DistEnv


def user_range(dataset_dir: str | Path, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s users ``[lo, hi)`` of ``world_size``: the same cut on every rank, from the dataset dir alone."""
    root = Path(dataset_dir)
    bounds = user_boundaries(root / split_file("train"), world_size, read_dataset_meta(root)["num_users"])
    return bounds[rank], bounds[rank + 1]


def rank_user_range(dataset_dir: str | Path, env: DistEnv) -> tuple[int, int]:
    """This rank's users ``[lo, hi)``."""
    return user_range(dataset_dir, env.rank, env.world_size)


def load_rank_data(
    dataset_dir: str | Path, env: DistEnv, valid_in_train: bool = False
) -> tuple[RetrievalData, list[int]]:
    """(this rank's users' data with the global item counts set, every rank's number of training examples);
    ``valid_in_train``: with the valid rows moved into train first (data.train_on_valid)."""
    data = load_dataset(dataset_dir, rank_user_range(dataset_dir, env))
    if valid_in_train:
        data = with_valid_in_train(data)
    train = data.splits["train"]
    item_counts = np.bincount(train.item_ids, minlength=data.num_items).astype(np.int64)
    examples = int((~data.is_heldout(train.user_ids)).sum())
    example_counts = [examples]
    if env.world_size > 1:
        counts = torch.from_numpy(item_counts).to(env.device)
        dist.all_reduce(counts)
        item_counts = counts.cpu().numpy()
        gathered = [torch.zeros(1, dtype=torch.int64, device=env.device) for _ in range(env.world_size)]
        dist.all_gather(gathered, torch.tensor([examples], dtype=torch.int64, device=env.device))
        example_counts = [int(g.item()) for g in gathered]
    return dataclasses.replace(data, global_item_counts=item_counts), example_counts
