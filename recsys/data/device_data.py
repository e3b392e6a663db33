"""What the batch builders read of a dataset, moved once to the training device and validated once whole.

The device loader (``TrainBatches(device=...)``) builds every batch from these tensors with torch ops on the
device; the host only launches. Every id a batch can carry comes from one of these arrays (or is a uniform
negative drawn below the item count), so checking each array once against its table replaces the per-batch
check of the host loader, which on an accelerator would cost a host sync per feature per step.
"""

from __future__ import annotations

import dataclasses

import torch

from recsys.data.arrays import on_device
from recsys.data.dataset import RetrievalData
from recsys.data.features import validate_ids


def validate_sources(data: RetrievalData) -> None:
    """Raise (``validate_ids``' message) if any id array a training batch reads falls outside its table."""
    rows = data.table_num_rows
    train = data.splits["train"]
    validate_ids("user_id", train.user_ids, rows["user"])
    validate_ids("item_id", train.item_ids, rows["item"])
    if data.has_categories:
        validate_ids("categories", data.item_category_ids, rows["category"])
    if data.has_neighbors:
        validate_ids("item_neighbors", data.item_neighbor_ids, rows["neighbor"])
    for f in data.side_features:
        validate_ids(f.label, f.ids, rows[f.table], table=f.table)


def data_on_device(data: RetrievalData, device: torch.device) -> RetrievalData:
    """``data`` with the arrays the row sources read (item categories and neighbours, side columns, raw ids) as
    tensors on ``device``; the splits stay on the host (the epoch's order is drawn there)."""
    return dataclasses.replace(
        data,
        item_category_indptr=on_device(data.item_category_indptr, device),
        item_category_ids=on_device(data.item_category_ids, device),
        item_neighbor_indptr=on_device(data.item_neighbor_indptr, device),
        item_neighbor_ids=on_device(data.item_neighbor_ids, device),
        side_features=tuple(
            dataclasses.replace(f, indptr=on_device(f.indptr, device), ids=on_device(f.ids, device))
            for f in data.side_features
        ),
        raw_user_ids=on_device(data.raw_user_ids, device),
        raw_item_ids=on_device(data.raw_item_ids, device),
    )
