"""A synthetic (train, valid) interaction matrix for the EASE and iALS benchmarks (scripts/bench_ease.py,
scripts/bench_ials.py): the same matrix for both at the same sizes and seed."""

from __future__ import annotations

import numpy as np

from recsys.ranking.interactions import UserItemCSR


def synthetic_split(
    num_users: int, num_items: int, nnz: int, *, holdout: float = 0.1, seed: int = 0
) -> tuple[UserItemCSR, UserItemCSR]:
    """A (train, valid) pair of the given size for timing: users with a lognormal number of items
    drawn from a Zipf-like popularity (exponent 0.8), ``holdout`` of each user's pairs held out.
    Repeats are collapsed, so the pair count comes out a little under ``nnz``."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(0.0, 1.0, num_users)
    lengths = np.maximum(1, np.round(lengths * nnz / lengths.sum())).astype(np.int64)
    pop = 1.0 / (np.arange(num_items) + 10.0) ** 0.8
    users = np.repeat(np.arange(num_users), lengths)
    items = rng.permutation(num_items)[rng.choice(num_items, size=users.shape[0], p=pop / pop.sum())]
    held = rng.random(users.shape[0]) < holdout
    train = UserItemCSR.from_pairs(users[~held], items[~held], num_users=num_users, num_items=num_items)
    valid = UserItemCSR.from_pairs(users[held], items[held], num_users=num_users, num_items=num_items)
    return train, valid


def valid_sample(
    history: UserItemCSR, relevant: UserItemCSR, max_users: int, seed: int = 0
) -> tuple[UserItemCSR, UserItemCSR]:
    """(history, relevant) of at most ``max_users`` users, a seeded uniform sample (as the evaluation stage scores
    a valid sample)."""
    if history.num_users <= max_users:
        return history, relevant
    rows = np.sort(np.random.default_rng(seed).choice(history.num_users, size=max_users, replace=False))
    return history.select_rows(rows), relevant.select_rows(rows)
