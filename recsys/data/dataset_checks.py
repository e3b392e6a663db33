"""Every count in a dataset dir's meta.json against its files (from parquet metadata: no rows are read).

A meta.json that disagrees with its files (edited, or copied from another dataset) would otherwise size
a table wrongly or report another dataset's counts, silently. An empty training split is named as such.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.dataset_dir import ITEMS_FILE, ITEMS_VOCAB, META_FILE, SPLITS, USERS_FILE, USERS_VOCAB, split_file


def parquet_rows(path: Path) -> int:
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable parquet file ({e}); prepare the dataset again") from None


def check_meta_counts(root: Path, meta: dict) -> None:
    """Raise naming the file, the meta.json key and both values at the first count that does not match."""
    meta_path = root / META_FILE
    expected = {split_file(split): (f"counts.{split}", meta.get("counts", {}).get(split)) for split in SPLITS}
    expected[USERS_FILE] = ("num_users", meta.get("num_users"))
    expected[ITEMS_FILE] = ("num_items", meta.get("num_items"))
    expected[USERS_VOCAB] = ("num_users", meta.get("num_users"))
    expected[ITEMS_VOCAB] = ("num_items", meta.get("num_items"))
    for name, (key, count) in expected.items():
        path = root / name
        if count is None or not path.exists():  # optional files (users, vocabularies) and counts older dirs lack
            continue
        rows = parquet_rows(path)
        if rows != count:
            raise ValueError(
                f"{meta_path}: '{key}' is {count}, but {path} has {rows} rows; the dataset dir is "
                "inconsistent: prepare it again (python -m data_pipelines.prepare)"
            )
    train = root / split_file("train")
    if train.exists() and parquet_rows(train) == 0:
        raise ValueError(
            f"{train}: the train split is empty (0 rows): nothing to train on; prepare the dataset again, "
            "or check the source data and its filters (min_rating, k-core)"
        )
