"""The serving API's edge: what ``ServingBundle.recommend`` / ``recommend_batch`` / ``encode`` / ``encode_raw``
accept, checked before any lookup; anything else is one ``ValueError`` naming the argument and the value.

    item indices   a 1-D sequence of integers in [0, num_items) (not floats, text or nested lists): the dataset's
                   indices, which the bundle's ``vocab/items.parquet`` maps from raw ids (raw_id -> item_id)
    user ids       integers in [0, num_users), or None: a query without a user (no user row, no user features)
    raw ids        integers in [-2^63, 2^64) (one in [2^63, 2^64) is its two's-complement int64, as the pipeline
                   reads it)
    k              a positive integer (not a float, text or bool)
    a history      counts each item once, at its latest position: training bags hold distinct items (duplicate
                   (user, item) rows keep the latest), so a repeat must not weigh an item more

numpy only (the bundle loads without torchrec).
"""

from __future__ import annotations

import numbers

import numpy as np

RAW_ID_HINT = (
    "; item indices are the dataset's: map raw ids through the bundle's vocab/items.parquet (raw_id -> item_id), "
    "or (model.id_mapping=managed bundles) pass raw ids to encode_raw"
)
INT64_MAX = np.iinfo(np.int64).max


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _integers(values, name: str, hint: str = "") -> np.ndarray:
    """``values`` as a 1-D array of integers (int64, or object for Python ints beyond it), else a ValueError
    naming ``name`` and the first value that is not an integer."""
    if isinstance(values, (str, bytes, numbers.Number)):
        raise ValueError(f"{name}: expected a 1-D sequence of integers, got {type(values).__name__} {values!r}{hint}")
    try:
        array = np.asarray(values)
    except ValueError:  # nested lists of different lengths
        array = np.asarray(values, dtype=object)
    if array.ndim != 1 or (array.dtype == object and any(np.ndim(v) for v in array.tolist())):
        raise ValueError(f"{name}: expected a 1-D sequence of integers, got a nested sequence (shape {array.shape})")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind in "iu":
        return array
    bad = next((v for v in array.tolist() if not _is_integer(v)), None)
    if bad is not None:
        raise ValueError(f"{name}: expected integers, got {type(bad).__name__} {bad!r}{hint}")
    return array  # Python ints, some beyond int64


def _indices(values, name: str, size: int, what: str, hint: str = "") -> np.ndarray:
    """1-D integers in [0, size) as int64."""
    array = _integers(values, name, hint)
    if array.size:
        low, high = min(array.tolist()) if array.dtype == object else array.min(), array.max()
        if low < 0 or high >= size:
            raise ValueError(f"{name}: {what} must be in [0, {size}), got {int(low if low < 0 else high)}{hint}")
    return array.astype(np.int64)


def item_indices(values, num_items: int, name: str) -> np.ndarray:
    """Item indices (int64), as given."""
    return _indices(values, name, num_items, "item indices", RAW_ID_HINT)


def history_indices(history, num_items: int, name: str = "history") -> np.ndarray:
    """One user's item indices, oldest first, each item once at its latest position."""
    items = item_indices(history, num_items, name)
    return distinct_latest(np.array([len(items)]), items)[1]


def as_top_k(k) -> int:
    """``k`` as an int >= 1."""
    if not _is_integer(k) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {type(k).__name__} {k!r}")
    return int(k)


def user_index(user_id, num_users: int) -> int | None:
    """``recommend``'s ``user_id``: a dataset index, or None (a query without a user)."""
    if user_id is None:
        return None
    if not _is_integer(user_id) or not 0 <= user_id < num_users:
        raise ValueError(
            f"user_id: {type(user_id).__name__} {user_id!r} is not a user index in [0, {num_users}) (vocab/users.parquet "
            "maps raw ids); give one, or None (a query without a user)"
        )
    return int(user_id)


def user_indices(user_ids, num_users: int, count: int | None = None, per: str = "histories") -> np.ndarray | None:
    """``user_ids``: one dataset index per query (``count`` of them, when known), or None (queries without a user)."""
    if user_ids is None:
        return None
    ids = _indices(user_ids, "user_ids", num_users, "user indices (None: queries without users)")
    if count is not None and len(ids) != count:
        raise ValueError(f"user_ids: {len(ids)} user ids for {count} {per}; give one each, or None")
    return ids


def as_raw_ids(values, name: str) -> np.ndarray:
    """64-bit raw ids as int64 (ids in [2^63, 2^64) as their two's-complement int64)."""
    array = _integers(values, name)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)  # uint64 beyond 2^63 wraps to its int64 bit pattern
    out = []
    for value in array.tolist():
        if not -(2**63) <= value < 2**64:
            raise ValueError(f"{name}: {value} is beyond 64 bits; raw ids are in [-2^63, 2^64)")
        out.append(value - 2**64 if value > INT64_MAX else value)
    return np.array(out, dtype=np.int64)


def check_lengths(lengths, num_users: int, num_items: int, names: tuple[str, str]) -> np.ndarray:
    """``history_lengths``: one count >= 0 per user, summing to the number of history items given (``names``: the
    arguments holding the users and the items)."""
    users, items = names
    out = _integers(lengths, "history_lengths").astype(np.int64)
    if len(out) != num_users:
        raise ValueError(f"history_lengths: {len(out)} lengths for {num_users} {users}; give one per user")
    if out.size and out.min() < 0:
        raise ValueError(f"history_lengths: a negative length ({int(out.min())})")
    if int(out.sum()) != num_items:
        raise ValueError(f"history_lengths: they sum to {int(out.sum())}, but {items} holds {num_items} items")
    return out


def distinct_latest(lengths: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each user's distinct items at their latest positions, in order (``items``: the users' bags concatenated)."""
    lengths, items = np.asarray(lengths, dtype=np.int64), np.asarray(items, dtype=np.int64)
    users = np.repeat(np.arange(len(lengths)), lengths)
    order = np.lexsort((np.arange(len(items)), items, users))  # by user, then item, then position
    last = np.ones(len(items), dtype=bool)
    last[:-1] = (users[order][1:] != users[order][:-1]) | (items[order][1:] != items[order][:-1])
    if last.all():
        return lengths, items
    kept = np.sort(order[last])
    return np.bincount(users[kept], minlength=len(lengths)).astype(np.int64), items[kept]
