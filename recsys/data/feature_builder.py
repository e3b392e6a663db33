"""The feature builder: user / history / item arrays -> one validated KJT batch for both towers.

One key per key of the run's FeatureLayout (recsys/data/layout.py), each tower's rows filled by its entry's row
source (recsys/data/row_sources.py). The training batches (recsys/data/batches.py), the evaluation batches
(recsys/data/eval_batches.py) and the export's item embedding all build through it.
"""

from __future__ import annotations

from recsys.data import arrays
from recsys.data.arrays import Array
from recsys.data.batch import Batch
from recsys.data.dataset import RetrievalData
from recsys.data.features import build_kjt, validate_ids
from recsys.data.layout import CANDIDATE, QUERY, FeatureLayout, data_layout
from recsys.data.row_sources import ROW_SOURCES, BatchArrays

# KJT keys of the managed tables (recsys/model/managed.py) -> whose raw ids their values become
RAW_ID_KEYS = {"user": "user", "item": "item", "neighbor": "item"}


def raw_id_values(data: RetrievalData, values: dict) -> dict:
    """``values`` (each key's parts of indices, validated) with the managed keys' ids turned into the raw ids the
    managed tables read."""
    raw = {"user": data.raw_user_ids, "item": data.raw_item_ids}
    return {
        k: tuple(arrays.take(raw[RAW_ID_KEYS[k]], v) for v in parts) if k in RAW_ID_KEYS else parts
        for k, parts in values.items()
    }


class FeatureBuilder:
    """Builds validated KJT batches from user / history / item arrays: one key per key of its ``layout``
    (recsys/data/layout.py), each tower's rows filled by its entry's row source (recsys/data/row_sources.py).

    The arrays are numpy (``data`` as loaded) or torch tensors on the device ``data``'s arrays were moved to
    (recsys.data.device_data); ``validate=False`` when those were validated whole (no per-batch check then)."""

    def __init__(
        self,
        data: RetrievalData,
        history_length: int = 0,
        user_id: bool = True,
        sequence: bool = False,
        query_neighbors: bool = False,
        *,
        layout: FeatureLayout | None = None,
        validate: bool = True,
    ) -> None:
        """``layout``: the run's (its plan's: recsys/job/plan.py); None: the layout of ``history_length`` and the
        switches (recsys.config.query_layout's keyword arguments) over ``data`` (``data_layout``)."""
        self.data = data
        self.layout = layout or data_layout(
            data, history_length, user_id=user_id, sequence=sequence, query_neighbors=query_neighbors
        )
        self.history_length = self.layout.history_length
        self.keys = self.layout.keys()
        # each key's (query entry, candidate entry); None: that tower's rows are empty
        self.slots = [(self.layout.spec(k, QUERY), self.layout.spec(k, CANDIDATE)) for k in self.keys]
        self.validate = validate

    def build(
        self,
        *,
        user_ids: Array,
        hist_lengths: Array,
        hist_items: Array,
        candidate_item_ids: Array,
        hist_categories: tuple[Array, Array] | None = None,
    ) -> Batch:
        """Query rows for ``user_ids`` (with their histories), then one candidate row per item.

        ``hist_categories``: (per-query lengths, values) of the history items' categories when the
        caller has them already (``TrainBatches``: contiguous ranges of a row-aligned copy);
        otherwise they are gathered from the item -> categories CSR.
        """
        # ids first: they index the category and side columns, and numpy would wrap a negative one
        sizes = self.data.table_num_rows
        if self.validate:
            validate_ids("user_id", user_ids, sizes["user"])
            validate_ids("history_item_ids", hist_items, sizes["item"])
            validate_ids("item_id", candidate_item_ids, sizes["item"])
        if self.history_length <= 0:  # no history feature: empty bags on query rows
            hist_lengths, hist_items = arrays.zeros(len(user_ids), like=user_ids), hist_items[:0]
            hist_categories = None
        batch_arrays = BatchArrays(
            self.data,
            user_ids,
            hist_lengths,
            hist_items,
            candidate_item_ids,
            hist_categories,
            num_rows=sizes,
            validate=self.validate,
        )
        lengths, values = {}, {}
        for key, towers in zip(self.keys, self.slots):  # each key's values in row order: queries', candidates'
            parts = [
                ROW_SOURCES[spec.source](batch_arrays, spec) if spec is not None else _empty(count, user_ids)
                for spec, count in zip(towers, (len(user_ids), len(candidate_item_ids)))
            ]
            lengths[key] = (parts[0][0], parts[1][0])  # concatenated once for all keys, by build_kjt
            values[key] = (parts[0][1], parts[1][1])
        if self.data.raw_item_ids is not None:  # model.id_mapping=managed: the managed tables read raw ids
            values = raw_id_values(self.data, values)
        return Batch(
            features=build_kjt(self.keys, lengths, values),
            candidate_item_ids=arrays.to_tensor(candidate_item_ids),
            num_queries=len(user_ids),
            history_lengths=arrays.to_tensor(hist_lengths),
            history_items=arrays.to_tensor(hist_items),
        )


def _empty(num_rows: int, like: Array) -> tuple[Array, Array]:
    return arrays.zeros(num_rows, like=like), arrays.zeros(0, like=like)
