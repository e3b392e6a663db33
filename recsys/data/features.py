"""The batch's KeyedJaggedTensor layout, and id validation.

A batch is one KeyedJaggedTensor holding both towers' features (one sparse lookup, one input
all-to-all per step), with **one key per table, named after it**. Its stride is R = B_q + C:
rows [0, B_q) carry the queries' ids, rows [B_q, R) the candidates' ids::

    key        rows [0, B_q): query                        rows [B_q, R): candidate
    user       the user id (1)                             empty
    item       the user's history (0..history_length)      the candidate item (1)
    category   the categories of those history items       the candidate's categories (1..3)
    neighbor   the history again with model.query_neighbors the candidate's co-occurrence neighbours
               (the bag pooled through this table too),    (0..data.item_neighbors; only when > 0)
               else empty
    sequence   the history again, oldest first, for         empty
               the query encoder's unpooled lookup (sasrec)
               (an EmbeddingCollection); the item key's
               query rows are then empty
    <side>     model.features' tables after these, one key each (recsys/data/side_features.py)

Which keys a run's batches carry, which tower reads each and where their rows come from is its
FeatureLayout (recsys/data/layout.py), worked out once from the config and the data.

Why not one key per feature (``history_item_ids`` and ``item_id`` both on the item table, stride
C)? fbgemm's CPU backward takes its fast path (JIT SpMDM + row-wise Adagrad, parallel over rows)
only for a table looked up by a single feature; a table shared by two features goes through a
serial scalar loop, about twice as slow (docs/performance.md, "What changed for speed"). On CUDA
both are fast; the layout costs nothing there.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data import arrays
from recsys.data.arrays import Array

Parts = Array | tuple  # an array, or a tuple of arrays to concatenate

TABLES: list[str] = ["user", "item", "category"]
# the candidate's neighbour bag looks up a table of its own (item-sized), not the item table: a
# second key on the item table would leave fbgemm's fast CPU path (see above)
NEIGHBOR_TABLE = "neighbor"
# a sequence query encoder's (e.g. sasrec's) per-position lookup of the history: an item-sized table of its own in an
# EmbeddingCollection (unpooled), beside the EmbeddingBagCollection's tables
SEQUENCE_TABLE = "sequence"
ALL_TABLES: list[str] = [*TABLES, NEIGHBOR_TABLE, SEQUENCE_TABLE]
CANDIDATE_TABLES: list[str] = ["item", "category"]


# the named arrays the batch builder validates, and the table each indexes (for error messages)
FEATURE_TABLES: dict[str, str] = {
    "user_id": "user",
    "history_item_ids": "item",
    "history_categories": "category",
    "item_id": "item",
    "item_categories": "category",
    "categories": "category",  # history's and candidates' together
    "item_neighbors": NEIGHBOR_TABLE,
    "sequence_item_ids": SEQUENCE_TABLE,
}


def validate_ids(feature: str, ids: Array, num_rows: int, table: str | None = None) -> None:
    """Raise if any id of ``feature`` falls outside its table (``table``, else ``FEATURE_TABLES``'s) of ``num_rows`` rows.

    fbgemm's CPU kernel would silently rewrite such an id to row 0 and train that row, so this
    runs on every batch before the lookup (a min and a max over numpy arrays: cheap).
    """
    if len(ids) == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    table = table or FEATURE_TABLES.get(feature, feature)
    if low < 0:
        raise ValueError(f"feature '{feature}': id {low} is negative (table '{table}' has {num_rows} rows)")
    if high >= num_rows:
        raise ValueError(
            f"feature '{feature}': id {high} is out of range for table '{table}' "
            f"of {num_rows} rows (valid ids are 0..{num_rows - 1})"
        )


def validate_kjt(features: KeyedJaggedTensor, table_num_rows: Mapping[str, int]) -> None:
    """Validate every key of a KJT (a table name) against that table's size."""
    for key, jagged in features.to_dict().items():
        validate_ids(key, jagged.values().cpu().numpy(), table_num_rows[key])


def build_kjt(keys: list[str], lengths: dict[str, Parts], values: dict[str, Parts]) -> KeyedJaggedTensor:
    """Per-feature (lengths, values), all of one stride, into a KJT: each an array, or a tuple of arrays whose
    concatenation it is (a key's query rows', then its candidate rows'), all concatenated at once. numpy arrays:
    a KJT on the host; tensors: on their device."""

    def joined(per_key: dict[str, Parts]) -> Array:
        return arrays.concat([part for k in keys for part in _parts(per_key[k])])

    # the values' count per key from the parts' shapes (host metadata): left to torchrec, it would be summed from the
    # lengths and read back, a host sync inside every training step when the batch was built on a GPU
    length_per_key = [sum(len(part) for part in _parts(values[k])) for k in keys]
    stride = sum(len(part) for part in _parts(lengths[keys[0]])) if keys else 0
    return KeyedJaggedTensor(
        keys=keys,
        values=arrays.to_tensor(joined(values), torch.int64),
        lengths=arrays.to_tensor(joined(lengths), torch.int32),
        stride=stride,
        length_per_key=length_per_key,
        offset_per_key=[0, *itertools.accumulate(length_per_key)],
    )


def _parts(x: Parts) -> tuple[Array, ...]:
    return x if isinstance(x, tuple) else (x,)
