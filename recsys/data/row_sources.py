"""Row sources: each fills one tower's rows of a KJT key (a ``FeatureSpec`` of recsys/data/layout.py).

A source takes the batch's arrays (:class:`BatchArrays`) and the entry, and returns that tower's
``(lengths, values)``: B_q lengths for a query entry, C for a candidate one, values in row order, their
ids validated against the entry's table (fbgemm's CPU kernel would silently train row 0 for an id out of
range). The user ids, history items and candidate items are validated once per batch by the caller. With
``BatchArrays.validate`` false (the device loader, whose source arrays were validated once whole) nothing is.
The arrays are numpy on the host or torch tensors on the training device (recsys/data/arrays.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from recsys.data import arrays, layout
from recsys.data.arrays import Array
from recsys.data.dataset import RetrievalData
from recsys.data.features import validate_ids
from recsys.data.layout import FeatureSpec
from recsys.data.ragged import gather_rows, segment_sum

Rows = tuple[Array, Array]  # (lengths [rows], values [sum of lengths])


@dataclass
class BatchArrays:
    """What one batch is built from: B_q queries (user, history bag) and C candidate items."""

    data: RetrievalData
    user_ids: Array  # [B_q]
    hist_lengths: Array  # [B_q]
    hist_items: Array  # [sum of hist_lengths], oldest first per query
    candidate_item_ids: Array  # [C]
    # (per-query lengths, values) of the history items' categories when the caller has them already
    hist_categories: Rows | None = None
    num_rows: dict[str, int] = field(default_factory=dict)  # each table's rows (data.table_num_rows)
    validate: bool = True  # false: the sources' ids were validated whole (recsys.data.device_data)

    def __post_init__(self) -> None:
        self.num_rows = self.num_rows or self.data.table_num_rows
        self.side = {f.name: f for f in self.data.side_features}


def _validated(b: BatchArrays, feature: str, rows: Rows, table: str, label: str | None = None) -> Rows:
    if b.validate:
        validate_ids(label or feature, rows[1], b.num_rows[table], table=table if label else None)
    return rows


def user_id(b: BatchArrays, spec: FeatureSpec) -> Rows:
    return arrays.ones(len(b.user_ids), like=b.user_ids), b.user_ids


def history(b: BatchArrays, spec: FeatureSpec) -> Rows:
    """The history bag (also the neighbour key's query rows, and the sequence key's, oldest first)."""
    return b.hist_lengths, b.hist_items


def item_id(b: BatchArrays, spec: FeatureSpec) -> Rows:
    return arrays.ones(len(b.candidate_item_ids), like=b.candidate_item_ids), b.candidate_item_ids


def history_categories(b: BatchArrays, spec: FeatureSpec) -> Rows:
    if b.hist_categories is None:
        per_item, cats = gather_rows(b.data.item_category_indptr, b.data.item_category_ids, b.hist_items)
        b.hist_categories = (segment_sum(per_item, b.hist_lengths), cats)
    return _validated(b, "categories", b.hist_categories, spec.table)


def item_categories(b: BatchArrays, spec: FeatureSpec) -> Rows:
    rows = gather_rows(b.data.item_category_indptr, b.data.item_category_ids, b.candidate_item_ids)
    return _validated(b, "categories", rows, spec.table)


def item_neighbors(b: BatchArrays, spec: FeatureSpec) -> Rows:
    rows = gather_rows(b.data.item_neighbor_indptr, b.data.item_neighbor_ids, b.candidate_item_ids)
    return _validated(b, "item_neighbors", rows, spec.table)


def _column(b: BatchArrays, spec: FeatureSpec, index: Array) -> Rows:
    f = b.side[spec.feature]
    return _validated(b, spec.feature, gather_rows(f.indptr, f.ids, index), spec.table, label=f.label)


def user_column(b: BatchArrays, spec: FeatureSpec) -> Rows:
    return _column(b, spec, b.user_ids)


def history_column(b: BatchArrays, spec: FeatureSpec) -> Rows:
    """All the query's history items' ids, one bag per query."""
    per_item, ids = _column(b, spec, b.hist_items)
    return segment_sum(per_item, b.hist_lengths), ids


def item_column(b: BatchArrays, spec: FeatureSpec) -> Rows:
    return _column(b, spec, b.candidate_item_ids)


ROW_SOURCES: dict[str, Callable[[BatchArrays, FeatureSpec], Rows]] = {
    layout.USER_ID: user_id,
    layout.HISTORY: history,
    layout.ITEM_ID: item_id,
    layout.HISTORY_CATEGORIES: history_categories,
    layout.ITEM_CATEGORIES: item_categories,
    layout.ITEM_NEIGHBORS: item_neighbors,
    layout.SEQUENCE: history,
    layout.USER_COLUMN: user_column,
    layout.HISTORY_COLUMN: history_column,
    layout.ITEM_COLUMN: item_column,
}
