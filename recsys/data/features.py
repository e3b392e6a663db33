"""Feature names, which table each one looks up, and id validation.

A batch is one KeyedJaggedTensor holding both towers' features (one sparse lookup, one
input all-to-all per step). Query features come first in the key order, then candidate features::

    feature              table      side        ids per example
    user_id              user       query       1
    history_item_ids     item       query       0..history_length (most recent items first-to-last)
    history_categories   category   query       categories of those items, concatenated
    item_id              item       candidate   1
    item_categories      category   candidate   1..3
"""

from __future__ import annotations

from typing import Dict, List, Mapping

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

FEATURE_TABLES: Dict[str, str] = {
    "user_id": "user",
    "history_item_ids": "item",
    "history_categories": "category",
    "item_id": "item",
    "item_categories": "category",
}
CANDIDATE_FEATURES: List[str] = ["item_id", "item_categories"]


def query_features(history_length: int) -> List[str]:
    """Query-side features; the history ones exist only when ``history_length > 0``."""
    if history_length > 0:
        return ["user_id", "history_item_ids", "history_categories"]
    return ["user_id"]


def validate_ids(feature: str, ids: np.ndarray, num_rows: int) -> None:
    """Raise if any id of ``feature`` falls outside its table of ``num_rows`` rows.

    fbgemm's CPU kernel would silently rewrite such an id to row 0 and train that row, so this
    runs on every batch before the lookup (a min and a max over numpy arrays: cheap).
    """
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    table = FEATURE_TABLES.get(feature, "?")
    if low < 0:
        raise ValueError(f"feature '{feature}': id {low} is negative (table '{table}' has {num_rows} rows)")
    if high >= num_rows:
        raise ValueError(
            f"feature '{feature}': id {high} is out of range for table '{table}' "
            f"of {num_rows} rows (valid ids are 0..{num_rows - 1})"
        )


def validate_kjt(features: KeyedJaggedTensor, table_num_rows: Mapping[str, int]) -> None:
    """Validate every feature of a KJT against the size of the table it looks up."""
    for key, jagged in features.to_dict().items():
        table = FEATURE_TABLES[key]
        validate_ids(key, jagged.values().cpu().numpy(), table_num_rows[table])


def build_kjt(keys: List[str], lengths: Dict[str, np.ndarray], values: Dict[str, np.ndarray]) -> KeyedJaggedTensor:
    """Concatenate per-feature (lengths, values) numpy arrays, all of one stride, into a KJT."""
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(np.concatenate([values[k] for k in keys]).astype(np.int64, copy=False)),
        lengths=torch.from_numpy(np.concatenate([lengths[k] for k in keys]).astype(np.int32, copy=False)),
    )
