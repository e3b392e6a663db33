"""Raw ids -> contiguous indices: vocabularies in ascending raw-id order, and their compaction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def same_type(*columns: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """Integer ids everywhere stay integers; otherwise every file's ids are compared as strings."""
    if all(pa.types.is_integer(c.type) for c in columns):
        return list(columns)
    return [pc.cast(c, pa.string()) for c in columns]


def id_kind(vocab: pa.Array) -> str:
    """meta.json ``raw_ids``: "integer" or "string" (log_columns.ids: which the rule gave)."""
    return "integer" if pa.types.is_integer(vocab.type) else "string"


def vocabulary(column: pa.ChunkedArray) -> pa.Array:
    """Distinct raw ids, ascending: index i is the id's contiguous index."""
    distinct = pc.unique(column)
    return distinct.take(pc.array_sort_indices(distinct))


def _index(column: pa.ChunkedArray, vocab: pa.Array) -> np.ndarray:
    """Contiguous index of each raw id in ``vocab``; -1 where it is not there."""
    return pc.fill_null(pc.index_in(column, value_set=vocab), -1).to_numpy().astype(np.int64)


def frame(log: pa.Table, users: pa.Array, items: pa.Array) -> pd.DataFrame:
    """The log with raw ids as indices into ``users`` / ``items`` (-1: not there)."""
    return pd.DataFrame(
        {
            "user_id": _index(log["user"], users),
            "item_id": _index(log["item"], items),
            "timestamp": log["timestamp"].to_numpy(),
            "rating": log["rating"].to_numpy(),
        }
    )


def compact(parts: list[pd.DataFrame], users: pa.Array, items: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Renumber ids so that every user and item left in ``parts`` is used (in place); the kept raw ids."""
    for column, vocab in (("user_id", users), ("item_id", items)):
        present = np.zeros(len(vocab), dtype=bool)  # O(rows), not a sort: ids are already < len(vocab)
        for p in parts:
            present[p[column].to_numpy()] = True
        if not present.all():
            used = np.flatnonzero(present)
            new_id = np.cumsum(present) - 1
            for p in parts:
                p[column] = new_id[p[column].to_numpy()].astype(np.int64)
            vocab = vocab.take(pa.array(used))
        if column == "user_id":
            users = vocab
        else:
            items = vocab
    return users, items
