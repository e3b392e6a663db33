"""The dataset dir: the one contract between ``data_pipelines`` and ``recsys``.

Layout (every id a contiguous 0-based int64 index)::

    <dir>/meta.json       name, protocol, seed, counts {train, valid, test}, num_users,
                          num_items, num_categories, sources [{file, sha256}], code_version,
                          cache_key (+ "spec" for synthetic data)
    <dir>/train.parquet   user_id int64, item_id int64, timestamp int64 (epoch, meta.json's
                          ``timestamps`` unit, or file order), rating float32
    <dir>/valid.parquet     sorted by (user_id, timestamp, item_id)
    <dir>/test.parquet
    <dir>/items.parquet   item_id int64 (0..num_items-1, sorted), categories list<int64>
                          (>= 1 ids in [0, num_categories), sorted, no duplicates; all empty
                          when num_categories is 0: the data has no categories), + side columns
    <dir>/users.parquet   user_id int64 (0..num_users-1, sorted), + side columns

``dataset_writer.write_dataset_dir`` validates, writes into ``<dir>.tmp-<pid>-<random>`` and renames
it into place, so a reader sees either the old complete dir or the new complete dir, never a mix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from data_pipelines.file_sizes import damaged_files

__all__ = [
    "CODE_VERSION",
    "CATEGORIES_VOCAB",
    "HELDOUT_USERS_FILE",
    "ITEMS_FILE",
    "ITEMS_VOCAB",
    "META_FILE",
    "OCCUPATIONS_VOCAB",
    "PARQUET_FILES",
    "SPLITS",
    "USERS_FILE",
    "USERS_VOCAB",
    "VOCAB_DIR",
    "dropped_rows_report",
    "is_complete",
    "read_meta",
    "split_file",
]

CODE_VERSION = "recsys-data/2"  # bump when any writer's output for the same input changes
# The file names of the layout above, here once: the pipelines write them, recsys/data/dataset.py reads them.
SPLITS = ("train", "valid", "test")
META_FILE = "meta.json"
ITEMS_FILE = "items.parquet"
USERS_FILE = "users.parquet"
HELDOUT_USERS_FILE = "heldout_users.parquet"  # strong_generalization: user_id, split ("valid" | "test")
VOCAB_DIR = "vocab"
USERS_VOCAB = f"{VOCAB_DIR}/users.parquet"  # raw_id -> user_id
ITEMS_VOCAB = f"{VOCAB_DIR}/items.parquet"  # raw_id -> item_id (+ title, genres where known)
CATEGORIES_VOCAB = f"{VOCAB_DIR}/categories.parquet"  # category_id -> name
OCCUPATIONS_VOCAB = f"{VOCAB_DIR}/occupations.parquet"  # occupation -> name (ml-100k, ml-1m)


def split_file(split: str) -> str:
    return f"{split}.parquet"


PARQUET_FILES = (*(split_file(s) for s in SPLITS), ITEMS_FILE, USERS_FILE)
REQUIRED_META = (
    "name",
    "protocol",
    "seed",
    "num_users",
    "num_items",
    "num_categories",
    "sources",
    "code_version",
    "cache_key",
)

INTERACTION_SCHEMA = pa.schema(
    [("user_id", pa.int64()), ("item_id", pa.int64()), ("timestamp", pa.int64()), ("rating", pa.float32())]
)
# ---------------------------------------------------------------- reading


def read_meta(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    """``<dataset_dir>/meta.json`` as a dict; FileNotFoundError / ValueError naming the path."""
    path = Path(dataset_dir) / META_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} not found: {Path(dataset_dir)} is not a dataset dir "
            "(create one with `python -m data_pipelines.prepare ...`)"
        ) from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is corrupt (not JSON: {e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path} is corrupt (expected a JSON object, got {type(meta).__name__})")
    missing = [k for k in (*REQUIRED_META, "counts") if k not in meta]
    if missing:
        raise ValueError(f"{path} is corrupt (missing key(s) {missing})")
    return meta


def dropped_rows_report(meta: Mapping[str, Any]) -> list[str]:
    """One line per split of a given split (``data.protocol=given``) that lost rows at prepare
    (meta.json ``given_split.dropped``), for the console and train.log; [] when none did."""
    lines = []
    for split, d in meta.get("given_split", {}).get("dropped", {}).items():
        reasons = {
            "a user with no train rows": d.get("user_not_in_train", 0),
            "an item never in train": d.get("item_not_in_train", 0),
            "a (user, item) pair already in train": d.get("pair_in_train", 0),
            "a duplicate (the latest kept) or a rating below data.min_rating": d.get("duplicates_or_rating", 0),
        }
        if sum(reasons.values()):
            said = ", ".join(f"{n} {why}" for why, n in reasons.items() if n)
            lines.append(
                f"given split: {sum(reasons.values())} of {d.get('rows')} {split} rows dropped ({said}); "
                "meta.json given_split.dropped"
            )
    return lines


def is_complete(dataset_dir: str | os.PathLike) -> bool:
    """True when meta.json and all five parquet files are present."""
    d = Path(dataset_dir)
    return all((d / f).is_file() for f in (META_FILE, *PARQUET_FILES))


def is_prepared(dataset_dir: str | os.PathLike, cache_key: str) -> bool:
    """True when the dir is complete, was written for ``cache_key`` and its files have the sizes meta.json
    records (a corrupt meta.json or a truncated file counts as not: the caller rebuilds the dir)."""
    if not is_complete(dataset_dir):
        return False
    try:
        meta = read_meta(dataset_dir)
    except ValueError:
        return False
    return meta.get("cache_key") == cache_key and not damaged_files(Path(dataset_dir), meta)
