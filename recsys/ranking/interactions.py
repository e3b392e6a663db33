"""Per-user sets of item ids (seen items to mask, relevant items to score) in CSR form.

Layout, for ``num_users = 3`` and rows ``{0: [2, 5], 1: [], 2: [0, 1, 4]}``::

    indptr  = [0, 2, 2, 5]          int64, [num_users + 1], indptr[0] = 0, non-decreasing
    indices = [2, 5, 0, 1, 4]       int64, [nnz], item ids of user u in indices[indptr[u]:indptr[u+1]],
                                    sorted ascending and unique within each row
    num_items = 6                   every item id is in [0, num_items)

Because rows are sorted and unique, the global keys ``user * num_items + item`` are strictly
increasing over ``indices``, which is what the vectorized look-ups in ``metrics.py`` rely on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d array by a sort and a neighbour comparison: numpy 2.4's ``np.unique`` hashes
    first, far slower on int64 keys (measured: docs/performance.md); the evaluation stage builds several CSRs."""
    out = np.sort(values)
    if out.size > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


@dataclass(frozen=True)
class UserItemCSR:
    """Sorted, deduplicated item ids per user (see the module docstring for the layout).

    Attributes:
        indptr: int64 [num_users + 1]; row u spans ``indices[indptr[u]:indptr[u + 1]]``.
        indices: int64 [nnz]; item ids, sorted ascending and unique within each row.
        num_items: size of the item id space; every id is in ``[0, num_items)``.
    """

    indptr: np.ndarray
    indices: np.ndarray
    num_items: int

    def __post_init__(self) -> None:
        if self.indptr.ndim != 1 or self.indptr.shape[0] < 1 or self.indptr[0] != 0:
            raise ValueError("indptr must be 1-D with indptr[0] == 0")
        if self.indptr[-1] != self.indices.shape[0]:
            raise ValueError(f"indptr[-1]={self.indptr[-1]} != len(indices)={self.indices.shape[0]}")
        if self.indptr.dtype != np.int64 or self.indices.dtype != np.int64:
            raise TypeError("indptr and indices must be int64")
        if self.num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {self.num_items}")

    @property
    def num_users(self) -> int:
        """Number of rows."""
        return int(self.indptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        """Number of stored (user, item) pairs."""
        return int(self.indices.shape[0])

    @classmethod
    def from_pairs(
        cls,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
        *,
        num_users: int,
        num_items: int,
    ) -> UserItemCSR:
        """Builds the CSR from parallel arrays of (user, item) pairs, [N] each; duplicates are dropped."""
        user_ids = np.asarray(user_ids, dtype=np.int64).ravel()
        item_ids = np.asarray(item_ids, dtype=np.int64).ravel()
        if user_ids.shape != item_ids.shape:
            raise ValueError(f"user_ids {user_ids.shape} and item_ids {item_ids.shape} differ in length")
        if user_ids.size:
            if user_ids.min() < 0 or user_ids.max() >= num_users:
                raise ValueError(f"user ids must be in [0, {num_users})")
            if item_ids.min() < 0 or item_ids.max() >= num_items:
                raise ValueError(f"item ids must be in [0, {num_items})")
        keys = sorted_unique(user_ids * num_items + item_ids)  # by user, then by item
        return cls._from_sorted_keys(keys, num_users=num_users, num_items=num_items)

    @classmethod
    def _from_sorted_keys(cls, keys: np.ndarray, *, num_users: int, num_items: int) -> UserItemCSR:
        if num_items == 0:
            return cls(np.zeros(num_users + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), 0)
        users = keys // num_items
        indptr = np.zeros(num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(users, minlength=num_users), out=indptr[1:])
        return cls(indptr, (keys - users * num_items).astype(np.int64), num_items)

    def row_user_ids(self) -> np.ndarray:
        """The user id of every stored pair, int64 [nnz] (the COO row array)."""
        return np.repeat(np.arange(self.num_users, dtype=np.int64), self.lengths())

    def keys(self) -> np.ndarray:
        """Global keys ``user * num_items + item``, int64 [nnz], strictly increasing."""
        return self.row_user_ids() * self.num_items + self.indices

    def union(self, other: UserItemCSR) -> UserItemCSR:
        """Row-wise set union with a CSR of the same shape (e.g. train ∪ valid items to mask at test)."""
        if other.num_users != self.num_users or other.num_items != self.num_items:
            raise ValueError(
                f"shape mismatch: ({self.num_users}, {self.num_items}) vs ({other.num_users}, {other.num_items})"
            )
        keys = np.union1d(self.keys(), other.keys())
        return self._from_sorted_keys(keys, num_users=self.num_users, num_items=self.num_items)

    def row(self, u: int) -> np.ndarray:
        """Item ids of user ``u``, int64 [lengths()[u]], sorted (a view, do not modify)."""
        return self.indices[self.indptr[u] : self.indptr[u + 1]]

    def lengths(self) -> np.ndarray:
        """Number of items per user, int64 [num_users]."""
        return np.diff(self.indptr)

    def select_rows(self, users: np.ndarray) -> UserItemCSR:
        """A CSR whose row j is row ``users[j]`` of this one (any order, repeats allowed)."""
        users = np.asarray(users, dtype=np.int64).ravel()
        if users.size and (users.min() < 0 or users.max() >= self.num_users):
            raise ValueError(f"user ids must be in [0, {self.num_users})")
        lens = self.lengths()[users]
        indptr = np.zeros(users.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        # position p of output row j reads input position indptr_in[users[j]] + (p - indptr[j])
        src = np.arange(indptr[-1], dtype=np.int64) + np.repeat(self.indptr[users] - indptr[:-1], lens)
        return UserItemCSR(indptr, self.indices[src], self.num_items)
