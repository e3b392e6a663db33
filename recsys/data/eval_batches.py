"""Evaluation batches: query-only batches of users with their latest history, candidate-only batches of items.

At evaluation, a user's bag is their latest ``history_length`` items in the splits that precede the evaluated one
(train for valid; train + valid for test), whichever way the training bags were drawn.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from recsys.data.batch import Batch
from recsys.data.dataset import Interactions
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.ragged import gather_ranges


def latest_items(
    timeline: Interactions, users: np.ndarray, num_users: int, history_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each user's ``history_length`` latest items in ``timeline``: (lengths, items), oldest first."""
    bounds = timeline.user_bounds(num_users)
    ends = bounds[users + 1]
    starts = np.maximum(bounds[users], ends - history_length)
    return gather_ranges(starts, ends, timeline.item_ids)


def query_batches(
    builder: FeatureBuilder, users: np.ndarray, timeline: Interactions, batch_size: int
) -> Iterator[Batch]:
    """Query-only batches for ``users`` with histories taken from ``timeline``."""
    num_users = builder.data.num_users
    for lo in range(0, len(users), batch_size):
        chunk = users[lo : lo + batch_size]
        hist_lengths, hist_items = latest_items(timeline, chunk, num_users, builder.history_length)
        yield builder.build(
            user_ids=chunk,
            hist_lengths=hist_lengths,
            hist_items=hist_items,
            candidate_item_ids=np.zeros(0, dtype=np.int64),
        )


def item_batches(builder: FeatureBuilder, item_ids: np.ndarray, batch_size: int) -> Iterator[Batch]:
    """Candidate-only batches (no queries) for ``item_ids``."""
    empty = np.zeros(0, dtype=np.int64)
    for lo in range(0, len(item_ids), batch_size):
        yield builder.build(
            user_ids=empty, hist_lengths=empty, hist_items=empty, candidate_item_ids=item_ids[lo : lo + batch_size]
        )
