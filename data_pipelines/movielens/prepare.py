"""prepare_movielens: source -> parse -> filter -> ids -> split protocol -> features -> dataset dir (cached by key)."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from data_pipelines.dataset_dir import (
    CATEGORIES_VOCAB,
    CODE_VERSION,
    HELDOUT_USERS_FILE,
    ITEMS_VOCAB,
    OCCUPATIONS_VOCAB,
    USERS_VOCAB,
    is_complete,
    is_prepared,
)
from data_pipelines.dataset_writer import write_dataset_dir
from data_pipelines.filters import filter_interactions
from data_pipelines.movielens.features import _dense_map, _distinct, _items_tables, _users_tables
from data_pipelines.movielens.parse import _ratings_frame, _ratings_table, _read_movies, _read_users
from data_pipelines.movielens.releases import (
    PIPELINE_VERSION,
    RELEASES,
    YEAR_BUCKET_EDGES,
    MovieLensError,
    locate_source,
)
from data_pipelines.splits import PROTOCOLS, split, strong_generalization_users


def cache_key(release: str, sources: list[dict[str, str]], protocol: str, seed: int, options: dict[str, Any]) -> str:
    """16 hex of sha256 over (release, source sha256s, protocol, seed, filter/protocol options, versions)."""
    payload = {
        "release": release,
        "sources": sorted(s["sha256"] for s in sources),
        "protocol": protocol,
        "seed": seed,
        "options": options,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def prepare_movielens(
    release: str,
    *,
    root: str | os.PathLike,
    name: str | None = None,
    protocol: str = "recbole",
    seed: int = 0,
    min_rating: float = 0.0,
    min_user_interactions: int = 0,
    min_item_interactions: int = 0,
    num_heldout_users: int = 0,
    url: str = "",
    md5: str = "",
    allow_download: bool = True,
    progress: bool = True,
) -> Path:
    """Prepare ``<root>/<release>-<protocol>-<cache_key>`` and return its absolute path.

    Idempotent: a complete dir whose meta.json carries the same key is returned untouched
    (the key covers the source files' sha256, the protocol, the seed and every option).
    ``min_rating`` keeps ratings >= it (stars; 0 keeps all); ``min_*_interactions`` is the
    k-core (0 disables); ``num_heldout_users`` is for strong_generalization (0 = proportional).
    """
    rel = _release(release, protocol)
    root = Path(root).absolute()
    src = locate_source(rel, root, url=url, md5=md5, allow_download=allow_download, progress=progress)
    options = {
        "min_rating": float(min_rating),
        "min_user_interactions": int(min_user_interactions),
        "min_item_interactions": int(min_item_interactions),
    }
    protocol_options: dict[str, Any] = {}
    if protocol == "strong_generalization":
        protocol_options = {"num_heldout_users": int(num_heldout_users), "drop_unseen_items": True}
    cached = dict(rel=rel, root=root, protocol=protocol, seed=seed, options={**options, **protocol_options})

    pending_sources = _hashed_if_maybe_cached(src, root.glob(f"{rel.name}-{protocol}-*"))
    if pending_sources is not None:
        key, out_dir = _key_and_dir(pending_sources.result(), **cached)
        if is_prepared(out_dir, key):
            return out_dir
    kept, movies, users, num_raw, pending_sources = _read_and_filter(src, rel, options, pending_sources)
    raw_users, raw_items, parts, heldout = _split_ids(
        kept, rel, protocol, seed, options, protocol_options, num_heldout_users
    )
    items, users_table, extra, user_feature_sizes = _side_tables(src, rel, raw_users, raw_items, movies, users)
    sources = pending_sources.result()
    key, out_dir = _key_and_dir(sources, **cached)
    num_categories = len(extra[CATEGORIES_VOCAB])
    meta = _meta(
        rel, name, protocol, seed, options, protocol_options, raw_users, raw_items, num_categories, num_raw,
        user_feature_sizes, sources, key,
    )  # fmt: skip
    if heldout is not None:
        _add_heldout(heldout, extra, meta)
    train, valid, test = parts
    return write_dataset_dir(
        out_dir, train=train, valid=valid, test=test, items=items, users=users_table, meta=meta, extra_tables=extra
    )


def _release(release: str, protocol: str):
    """The release's description; an unknown release or protocol is refused."""
    if release not in RELEASES:
        raise MovieLensError(f"unknown MovieLens release {release!r}; known: {', '.join(RELEASES)}")
    if protocol not in PROTOCOLS:
        raise MovieLensError(f"unknown split protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
    return RELEASES[release]


def _key_and_dir(
    sources: list[dict[str, str]], *, rel, root: Path, protocol: str, seed: int, options: dict[str, Any]
) -> tuple[str, Path]:
    key = cache_key(rel.name, sources, protocol, seed, options)
    return key, root / f"{rel.name}-{protocol}-{key}"


def _side_tables(src, rel, raw_users, raw_items, movies, users):
    """(items.parquet, users.parquet, {vocab file: table}, meta ``user_features``) for the ids kept."""
    ratings_label = src.describe(rel.ratings)
    items, item_vocab, category_vocab = _items_tables(raw_items, movies, ratings_label, src.describe(rel.movies))
    users_table, user_vocab, occupation_vocab, user_feature_sizes = _users_tables(
        raw_users, users, ratings_label, src.describe(rel.users) if rel.users else None, rel.layout
    )
    extra = {USERS_VOCAB: user_vocab, ITEMS_VOCAB: item_vocab, CATEGORIES_VOCAB: category_vocab}
    if occupation_vocab is not None:
        extra[OCCUPATIONS_VOCAB] = occupation_vocab
    return items, users_table, extra, user_feature_sizes


def _hashed_if_maybe_cached(src, candidates) -> Future | None:
    """The sources' checksums now (a done Future) when a complete dir of this release and protocol exists;
    else None. The key needs the sources' sha256 (~0.5 s for ml-25m); only such a dir can be a cache hit,
    and without one the hash runs on a second thread once the CSV reader (which uses every core) is done."""
    if not any(is_complete(d) for d in candidates):
        return None
    done: Future = Future()
    done.set_result(src.checksums())
    return done


def _meta(
    rel,
    name: str | None,
    protocol: str,
    seed: int,
    options: dict[str, Any],
    protocol_options: dict[str, Any],
    raw_users: np.ndarray,
    raw_items: np.ndarray,
    num_categories: int,
    num_raw: int,
    user_feature_sizes: dict,
    sources: list[dict[str, str]],
    key: str,
) -> dict[str, Any]:
    """meta.json of a prepared release (``write_dataset_dir`` adds the counts)."""
    return {
        "name": name or f"movielens_{rel.name.removeprefix('ml-').replace('-', '_')}",
        "release": rel.name,
        "protocol": protocol,
        "seed": seed,
        "filters": options,
        "protocol_options": protocol_options,
        "num_users": len(raw_users),
        "num_items": len(raw_items),
        "num_categories": num_categories,
        "num_raw_ratings": num_raw,
        "num_year_buckets": len(YEAR_BUCKET_EDGES) + 2,
        "year_bucket_edges": list(YEAR_BUCKET_EDGES),
        "user_features": user_feature_sizes,
        "item_features": {"year_bucket": len(YEAR_BUCKET_EDGES) + 2},  # ids per column, for model.features
        "sources": sources,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
        "cache_key": key,
    }


def _read_and_filter(src, rel, options: dict[str, Any], pending_sources: Future | None):
    """(kept ratings, movies, users, raw rating count, pending sources' checksums): the ratings parsed and filtered,
    the movies and users files (and the hash, if still needed) read on a second thread meanwhile."""
    table = _ratings_table(src, rel)
    num_raw = table.num_rows
    # Second thread, beside the numpy work: the movies and users files (read and checked here, before
    # anything can fail on the ratings, so errors come in file order), then the hash if still needed.
    pool = ThreadPoolExecutor(max_workers=1)
    pending_features = pool.submit(lambda: (_read_movies(src, rel), _read_users(src, rel)))
    if pending_sources is None:
        pending_sources = pool.submit(src.checksums)
    pool.shutdown(wait=False)  # its thread ends with the last job
    # Hand the CSV reader's scratch memory back to the OS now: the numpy arrays that follow then reuse
    # those pages, which on a VM is several times faster than touching fresh ones.
    pa.default_memory_pool().release_unused()
    batches = table.to_batches()
    del table  # the batches hold the only references: _ratings_frame frees them one by one
    ratings = _ratings_frame(batches, min_rating=options["min_rating"])  # the rating filter, applied early
    kept = filter_interactions(ratings, **options)
    del ratings
    movies, users = pending_features.result()
    if len(kept) == 0:
        raise MovieLensError(f"{src.describe(rel.ratings)}: no ratings left after the filters {options} (of {num_raw})")
    return kept, movies, users, num_raw, pending_sources


def _split_ids(
    kept: pd.DataFrame,
    rel,
    protocol: str,
    seed: int,
    options: dict[str, Any],
    protocol_options: dict[str, Any],
    num_heldout_users: int,
):
    """(raw user ids, raw item ids, [train, valid, test], held-out (valid, test) users or None): contiguous ids,
    the split protocol, and ids compacted again when the protocol dropped users or items."""
    # contiguous ids before the split: small ids make its sorts one-pass (splits.lexsort_fast)
    raw_users, raw_items = _distinct(kept["user_id"].to_numpy()), _distinct(kept["item_id"].to_numpy())
    kept["user_id"] = _dense_map(kept["user_id"].to_numpy(), raw_users)
    kept["item_id"] = _dense_map(kept["item_id"].to_numpy(), raw_items)
    heldout = None
    if protocol == "strong_generalization":
        heldout = strong_generalization_users(kept, seed=seed, num_heldout_users=num_heldout_users)
    try:
        parts = list(split(kept, protocol, seed=seed, **protocol_options))
    except ValueError as e:
        raise MovieLensError(f"{rel.name}, protocol {protocol}: {e}") from None
    num_kept = len(kept)
    del kept
    for split_name, part in zip(("train", "valid", "test"), parts):
        if len(part) == 0:
            raise MovieLensError(
                f"{rel.name}: protocol {protocol} (seed {seed}, filters {options}) leaves the {split_name} split "
                f"empty ({[len(p) for p in parts]} train/valid/test rows); nothing was written"
            )

    # the protocol may drop users or items (strong_generalization drops rows): compact the ids again
    if sum(len(p) for p in parts) < num_kept:
        used_users = _distinct(np.concatenate([p["user_id"].to_numpy() for p in parts]))
        used_items = _distinct(np.concatenate([p["item_id"].to_numpy() for p in parts]))
    else:  # every kept row is in a split, so every user and item is too
        used_users, used_items = np.arange(len(raw_users)), np.arange(len(raw_items))
    if len(used_users) < len(raw_users) or len(used_items) < len(raw_items):
        for p in parts:
            p["user_id"] = _dense_map(p["user_id"].to_numpy(), used_users)
            p["item_id"] = _dense_map(p["item_id"].to_numpy(), used_items)
        if heldout is not None:
            heldout = tuple(_dense_map(h[np.isin(h, used_users)], used_users) for h in heldout)
        raw_users, raw_items = raw_users[used_users], raw_items[used_items]
    return raw_users, raw_items, parts, heldout


def _add_heldout(heldout, extra: dict[str, pd.DataFrame], meta: dict[str, Any]) -> None:
    """strong_generalization: heldout_users.parquet and what meta.json says of the protocol."""
    valid_users, test_users = heldout
    extra[HELDOUT_USERS_FILE] = pd.DataFrame(
        {
            "user_id": np.concatenate([valid_users, test_users]).astype(np.int64),
            "split": ["valid"] * len(valid_users) + ["test"] * len(test_users),
        }
    )
    meta["strong_generalization"] = {
        "num_valid_users": len(valid_users),
        "num_test_users": len(test_users),
        "fold_in": "train.parquet rows of the users in heldout_users.parquet (80%); targets in valid/test (20%)",
        "recall": "hits / min(K, |relevant|)",
        "ndcg_k": 100,
    }
