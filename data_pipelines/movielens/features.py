"""Contiguous ids and the item / user feature tables and vocabularies of a release."""

from __future__ import annotations

import numpy as np
import pandas as pd

from data_pipelines.movielens.parse import _Movie
from data_pipelines.movielens.releases import (
    _RAW_ID_LOOKUP_LIMIT,
    _YEAR,
    AGE_BUCKET_EDGES,
    GENDERS,
    ML1M_OCCUPATIONS,
    NO_GENRE,
    YEAR_BUCKET_EDGES,
    MovieLensError,
)


def _dense_map(raw: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Map raw ids to their index in ``present`` (sorted, containing every raw id)."""
    if len(present) and present[0] >= 0 and present[-1] < _RAW_ID_LOOKUP_LIMIT:
        lookup = np.full(int(present[-1]) + 1, -1, dtype=np.int64)
        lookup[present] = np.arange(len(present), dtype=np.int64)
        return lookup[raw]
    return np.searchsorted(present, raw).astype(np.int64)


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct values (O(n) for small non-negative ints)."""
    if len(ids) and ids.min() >= 0 and ids.max() < _RAW_ID_LOOKUP_LIMIT:
        seen = np.zeros(int(ids.max()) + 1, dtype=bool)
        seen[ids] = True
        return np.flatnonzero(seen).astype(np.int64)
    return np.unique(ids)


def _year_buckets(years: np.ndarray) -> np.ndarray:
    buckets = 1 + np.searchsorted(np.asarray(YEAR_BUCKET_EDGES), years, side="right")
    return np.where(years > 0, buckets, 0).astype(np.int64)


def _items_tables(raw_item_ids: np.ndarray, movies: dict[int, _Movie], ratings_label: str, movies_label: str):
    missing = [int(i) for i in raw_item_ids if int(i) not in movies]
    if missing:
        raise MovieLensError(
            f"{ratings_label}: movie id(s) {missing[:5]} ({len(missing)} in all) have no row in {movies_label}"
        )
    kept = [movies[int(i)] for i in raw_item_ids]
    names = sorted({g for m in kept for g in m.genres} | ({NO_GENRE} if any(not m.genres for m in kept) else set()))
    index = {g: c for c, g in enumerate(names)}
    categories = [sorted(index[g] for g in set(m.genres)) or [index[NO_GENRE]] for m in kept]
    years = np.array([int(y.group(1)) if (y := _YEAR.search(m.title)) else 0 for m in kept], dtype=np.int64)
    n = len(kept)
    items = pd.DataFrame(
        {
            "item_id": np.arange(n, dtype=np.int64),
            "categories": categories,
            "title": [m.title for m in kept],
            "year": years,
            "year_bucket": _year_buckets(years),
        }
    )
    vocab = pd.DataFrame(
        {
            "raw_id": raw_item_ids.astype(np.int64),
            "item_id": np.arange(n, dtype=np.int64),
            "title": [m.title for m in kept],
            "genres": [m.genres_raw for m in kept],
        }
    )
    category_vocab = pd.DataFrame({"category_id": np.arange(len(names), dtype=np.int64), "name": names})
    return items, vocab, category_vocab


def _users_tables(
    raw_user_ids: np.ndarray, users: pd.DataFrame | None, ratings_label: str, users_label: str | None, layout: str
):
    n = len(raw_user_ids)
    vocab = pd.DataFrame({"raw_id": raw_user_ids.astype(np.int64), "user_id": np.arange(n, dtype=np.int64)})
    table = pd.DataFrame({"user_id": np.arange(n, dtype=np.int64)})
    if users is None:
        return table, vocab, None, {}
    dup = users["raw_id"].duplicated()
    if dup.any():
        raise MovieLensError(f"{users_label}: user id {int(users['raw_id'][dup].iloc[0])} appears twice")
    by_raw = users.set_index("raw_id")
    missing = np.setdiff1d(raw_user_ids, by_raw.index.to_numpy())
    if len(missing):
        raise MovieLensError(f"{ratings_label}: user id(s) {missing[:5].tolist()} have no row in {users_label}")
    rows = by_raw.loc[raw_user_ids]
    # ml-1m: its 21 codes in order; ml-100k: the names it uses, sorted
    occupations = list(ML1M_OCCUPATIONS) if layout == "dat" else sorted(set(users["occupation"]))
    occupation_index = {name: i for i, name in enumerate(occupations)}
    table["gender"] = rows["gender"].to_numpy(np.int64)
    table["age_bucket"] = np.searchsorted(np.asarray(AGE_BUCKET_EDGES), rows["age"].to_numpy(), side="right").astype(
        np.int64
    )
    table["occupation"] = np.array([occupation_index[o] for o in rows["occupation"]], dtype=np.int64)
    occupation_vocab = pd.DataFrame({"occupation": np.arange(len(occupations), dtype=np.int64), "name": occupations})
    sizes = {"gender": len(GENDERS), "age_bucket": len(AGE_BUCKET_EDGES) + 1, "occupation": len(occupations)}
    return table, vocab, occupation_vocab, sizes


# ---------------------------------------------------------------- prepare
